package monitor

import (
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/dflow-dev/dflow/internal/report"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot draws a report's series as a PNG: queue depth per queue over time
// on top, utilization per replica over time below. A starved replica
// shows as a low line next to its busy siblings, its queue as a line at 0.
func Plot(rep *report.Report, path string) error {
	if len(rep.Series) == 0 {
		return fmt.Errorf("plot: the report has no series; run with --interval shorter than the run")
	}
	top := plot.New()
	top.Title.Text = fmt.Sprintf("%s: queue depth (%s, %.1fs)", rep.Spec, rep.Status, rep.WallSeconds)
	top.Y.Label.Text = "items"
	top.Y.Min = 0
	if err := addLines(top, queueLines(rep)); err != nil {
		return err
	}
	util := plot.New()
	util.Title.Text = "utilization (busy share per interval)"
	util.Y.Min, util.Y.Max = 0, 1.05
	if err := addLines(util, replicaLines(rep, func(s report.Sample) map[string][]float64 { return s.Utilization })); err != nil {
		return err
	}
	idle := plot.New()
	idle.Title.Text = "idle share per interval (waiting for input: a starved replica stands out)"
	idle.X.Label.Text = "seconds"
	idle.Y.Min, idle.Y.Max = 0, 1.05
	if err := addLines(idle, replicaLines(rep, func(s report.Sample) map[string][]float64 { return s.Idle })); err != nil {
		return err
	}
	panels := []*plot.Plot{top, util, idle}
	for _, p := range panels {
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
	}
	img := vgimg.New(10*vg.Inch, 11*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot: %w", err)
	}
	return f.Close()
}

type line struct {
	name string
	pts  plotter.XYs
}

func queueLines(rep *report.Report) []line {
	byName := map[string]*line{}
	var names []string
	for _, s := range rep.Series {
		for _, edge := range slices.Sorted(maps.Keys(s.Queues)) {
			depths := s.Queues[edge]
			for i, d := range depths {
				name := edge
				if len(depths) > 1 {
					name = fmt.Sprintf("%s[%d]", edge, i)
				}
				if byName[name] == nil {
					byName[name] = &line{name: "q " + name}
					names = append(names, name)
				}
				byName[name].pts = append(byName[name].pts, plotter.XY{X: s.T, Y: float64(d)})
			}
		}
	}
	out := make([]line, len(names))
	for i, n := range names {
		out[i] = *byName[n]
	}
	return out
}

// replicaLines draws one line per replica of a per-replica series; stages
// with a single replica that is never busy (sources, sinks) are left out.
func replicaLines(rep *report.Report, of func(report.Sample) map[string][]float64) []line {
	byName := map[string]*line{}
	var names []string
	for _, s := range rep.Series {
		m := of(s)
		for _, stage := range slices.Sorted(maps.Keys(m)) {
			if len(rep.Stages[stage].Replicas) == 1 && rep.Stages[stage].Replicas[0].Utilization < 0.01 {
				continue
			}
			for i, u := range m[stage] {
				name := fmt.Sprintf("%s[%d]", stage, i)
				if byName[name] == nil {
					byName[name] = &line{name: name}
					names = append(names, name)
				}
				byName[name].pts = append(byName[name].pts, plotter.XY{X: s.T, Y: u})
			}
		}
	}
	out := make([]line, len(names))
	for i, n := range names {
		out[i] = *byName[n]
	}
	return out
}

func addLines(p *plot.Plot, lines []line) error {
	for i, l := range lines {
		lp, err := plotter.NewLine(l.pts)
		if err != nil {
			return fmt.Errorf("plot: %s: %w", l.name, err)
		}
		lp.Color = plotutil.Color(i)
		lp.Dashes = plotutil.Dashes(i / 7)
		lp.Width = vg.Points(1.5)
		p.Add(lp)
		p.Legend.Add(l.name, lp)
	}
	return nil
}

// Bar is one bar of a bar chart.
type Bar struct {
	Label string
	Value float64
}

// BarChart draws labelled bars into a PNG.
func BarChart(bars []Bar, title, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Min = 0
	values := make(plotter.Values, len(bars))
	labels := make([]string, len(bars))
	for i, b := range bars {
		values[i], labels[i] = b.Value, b.Label
	}
	bc, err := plotter.NewBarChart(values, vg.Points(50))
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	bc.Color = plotutil.Color(0)
	p.Add(bc, plotter.NewGrid())
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.75, float64(len(bars))-0.25
	p.Y.Label.Text = "items/s"
	if err := p.Save(6*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
