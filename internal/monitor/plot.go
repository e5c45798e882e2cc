package monitor

import (
	"fmt"
	"os"
	"sort"

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
	bottom := plot.New()
	bottom.Title.Text = "utilization (busy share per interval)"
	bottom.X.Label.Text = "seconds"
	bottom.Y.Min, bottom.Y.Max = 0, 1.05
	if err := addLines(bottom, utilLines(rep)); err != nil {
		return err
	}
	for _, p := range []*plot.Plot{top, bottom} {
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
	}
	img := vgimg.New(10*vg.Inch, 8*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
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
		for _, edge := range sortedKeys(s.Queues) {
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

func utilLines(rep *report.Report) []line {
	byName := map[string]*line{}
	var names []string
	for _, s := range rep.Series {
		for _, stage := range sortedKeys(s.Utilization) {
			for i, u := range s.Utilization[stage] {
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

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
