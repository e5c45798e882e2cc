package monitor

import (
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/report"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// ImageFormat returns the image format a plot path asks for by its
// extension, "png" or "jpeg", and an error naming the supported ones
// otherwise. Commands call it before a run, so a wrong name fails at
// once rather than after the work.
func ImageFormat(path string) (string, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		return "png", nil
	case ".jpg", ".jpeg":
		return "jpeg", nil
	}
	return "", fmt.Errorf("plot %q: the file name must end in .png, .jpg or .jpeg (the image format follows it)", path)
}

// Plot draws a report's series as an image (PNG or JPEG, by path's
// extension): queue depth per queue over time on top, busy share per
// replica below, idle share per replica at the bottom. A starved replica
// shows as a high line in the idle panel, its queue as a line at 0.
//
// Every series stays visible where lines coincide (two queues at 0, two
// replicas in lockstep): each has its own colour, dash pattern and marker
// shape, markers are staggered along the line, and each line is drawn a
// little thinner than the one before it, so one that lies on another
// shows as a band around it. The y axes start a little below 0 so a line
// at 0 does not sit on the axis, and the legends stand right of the
// panels, clear of the data.
func Plot(rep *report.Report, path string) error {
	format, err := ImageFormat(path)
	if err != nil {
		return err
	}
	if len(rep.Series) == 0 {
		return fmt.Errorf("plot: the report has no series; run with --interval shorter than the run")
	}
	top := plot.New()
	top.Title.Text = fmt.Sprintf("%s: queue depth (%s, %.1fs)", rep.Spec, rep.Status, rep.WallSeconds)
	top.Y.Label.Text = "items"
	util := plot.New()
	util.Title.Text = "utilization (busy share per interval)"
	util.Y.Label.Text = "busy share"
	idle := plot.New()
	idle.Title.Text = "idle share per interval (waiting for input: a starved replica stands out)"
	idle.Y.Label.Text = "idle share"
	idle.X.Label.Text = "seconds"
	panels := []*plot.Plot{top, util, idle}
	series := [][]line{
		queueLines(rep),
		replicaLines(rep, func(s report.Sample) map[string][]float64 { return s.Utilization }),
		replicaLines(rep, func(s report.Sample) map[string][]float64 { return s.Idle }),
	}
	legends := make([]plot.Legend, len(panels))
	for i, p := range panels {
		legends[i] = plot.NewLegend()
		legends[i].Top, legends[i].Left = true, true
		if err := addLines(p, &legends[i], series[i]); err != nil {
			return err
		}
		p.Add(plotter.NewGrid())
		ymax := 1.0
		if i == 0 {
			ymax = math.Max(maxY(series[i]), 1)
		}
		p.Y.Min, p.Y.Max = -0.04*ymax, 1.04*ymax
		p.X.Min, p.X.Max = 0, rep.Series[len(rep.Series)-1].T
	}
	const width, height = 12 * vg.Inch, 11 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	legendWidth := 2 * vg.Inch
	for _, l := range legends {
		legendWidth = max(legendWidth, l.Rectangle(dc).Size().X+4*vg.Millimeter)
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, draw.Crop(dc, 0, -legendWidth, 0, 0))
	for i, p := range panels {
		p.Draw(canvases[i][0])
		c := canvases[i][0]
		// The legend's own column, level with the top of its panel's
		// data area (below the title).
		lc := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: c.Max.X + 3*vg.Millimeter, Y: c.Min.Y},
			Max: vg.Point{X: width - vg.Millimeter, Y: c.Max.Y - p.Title.TextStyle.Height(p.Title.Text) - p.Title.Padding},
		}}
		legends[i].Draw(lc)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	var w io.WriterTo = vgimg.PngCanvas{Canvas: img}
	if format == "jpeg" {
		w = vgimg.JpegCanvas{Canvas: img}
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot: %w", err)
	}
	return f.Close()
}

type line struct {
	name string
	pts  plotter.XYs
}

func maxY(lines []line) float64 {
	m := 0.0
	for _, l := range lines {
		for _, p := range l.pts {
			m = math.Max(m, p.Y)
		}
	}
	return m
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
			if st := rep.Stages[stage]; len(st.Replicas) == 1 && st.Replicas[0].Utilization < 0.01 {
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

// palette has more distinct colours than plotutil's seven, so that the
// eight replicas of the seed's two busy stages do not share one.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, // blue
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, // red
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, // green
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, // orange
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, // purple
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, // brown
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, // pink
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, // cyan
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, // grey
	color.RGBA{0xbc, 0xbd, 0x22, 0xff}, // olive
}

func lineColor(i int) color.Color { return palette[i%len(palette)] }

// dashes are the lines' patterns: none as faint as a dotted line, so that
// a line alone at 0 still shows.
var dashes = [][]vg.Length{
	nil,
	{vg.Points(10), vg.Points(4)},
	{vg.Points(7), vg.Points(3), vg.Points(2), vg.Points(3)},
	{vg.Points(4), vg.Points(3)},
	{vg.Points(12), vg.Points(3), vg.Points(3), vg.Points(3), vg.Points(3), vg.Points(3)},
	{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)},
}

// Line widths: a line alone is baseWidth wide; lines lying on each other
// are drawn widest first, each later one narrower, so that the ones below
// show as bands around the one on top.
const (
	baseWidth = 2.0
	maxWidth  = 8.5
)

// markersPerLine bounds the markers on a line; they are staggered from
// line to line so that coinciding lines show every marker shape.
const markersPerLine = 24

func addLines(p *plot.Plot, legend *plot.Legend, lines []line) error {
	widths := widthsFor(lines)
	for i, l := range lines {
		lp, err := plotter.NewLine(l.pts)
		if err != nil {
			return fmt.Errorf("plot: %s: %w", l.name, err)
		}
		c := lineColor(i)
		lp.Color = c
		lp.Dashes = dashes[i%len(dashes)]
		lp.Width = vg.Points(widths[i])
		marks, err := plotter.NewScatter(markerPoints(l.pts, i, len(lines)))
		if err != nil {
			return fmt.Errorf("plot: %s: %w", l.name, err)
		}
		marks.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(4), Shape: plotutil.Shape(i)}
		p.Add(lp, marks)
		legend.Add(l.name, lp, marks)
	}
	return nil
}

// widthsFor gives each line its width: lines that lie on each other (at
// a third of their points or more, within 1.5% of the panel's height) form
// a group, drawn widest first.
func widthsFor(lines []line) []float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, p := range l.pts {
			lo, hi = math.Min(lo, p.Y), math.Max(hi, p.Y)
		}
	}
	tol := 0.015 * math.Max(hi-lo, 1)
	group := make([]int, len(lines)) // union-find over coinciding lines
	for i := range group {
		group[i] = i
	}
	find := func(i int) int {
		for group[i] != i {
			i = group[i]
		}
		return i
	}
	for i := range lines {
		for j := i + 1; j < len(lines); j++ {
			if coincide(lines[i].pts, lines[j].pts, tol) {
				group[find(j)] = find(i)
			}
		}
	}
	members := map[int][]int{}
	for i := range lines {
		members[find(i)] = append(members[find(i)], i)
	}
	widths := make([]float64, len(lines))
	for _, m := range members {
		step := 0.0
		if len(m) > 1 {
			step = math.Min(1.8, (maxWidth-baseWidth)/float64(len(m)-1))
		}
		for rank, i := range m {
			widths[i] = baseWidth + step*float64(len(m)-1-rank)
		}
	}
	return widths
}

// coincide reports whether two lines are within tol of each other at a
// third of their points or more.
func coincide(a, b plotter.XYs, tol float64) bool {
	n, near := min(len(a), len(b)), 0
	for k := range n {
		if math.Abs(a[k].Y-b[k].Y) <= tol {
			near++
		}
	}
	return n > 0 && 3*near >= n
}

// markerPoints picks about markersPerLine of pts for line i of n, at
// least every min(n, 5)th point, offset from line to line so that lines
// lying on each other show their markers at different places.
func markerPoints(pts plotter.XYs, i, n int) plotter.XYs {
	every := max(1, (len(pts)+markersPerLine-1)/markersPerLine, min(n, 5))
	var out plotter.XYs
	for j := i % every; j < len(pts); j += every {
		out = append(out, pts[j])
	}
	if len(out) == 0 {
		out = append(out, pts[len(pts)-1])
	}
	return out
}

// Bar is one bar of a bar chart.
type Bar struct {
	Label string
	Value float64
	// Note, when set, is printed over the bar after its value ("1.65x").
	Note string
}

// BarChart draws labelled bars into an image (PNG or JPEG by path's
// extension): each bar carries its value, and its note, above it.
func BarChart(bars []Bar, title, xLabel, path string) error {
	format, err := ImageFormat(path)
	if err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = title
	values := make(plotter.Values, len(bars))
	labels := make([]string, len(bars))
	var xys plotter.XYs
	var texts []string
	top := 0.0
	for i, b := range bars {
		values[i], labels[i] = b.Value, b.Label
		top = math.Max(top, b.Value)
		text := fmt.Sprintf("%.1f/s", b.Value)
		if b.Note != "" {
			text += " (" + b.Note + ")"
		}
		xys = append(xys, plotter.XY{X: float64(i), Y: b.Value})
		texts = append(texts, text)
	}
	bc, err := plotter.NewBarChart(values, vg.Points(50))
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	bc.Color = palette[0]
	labelsOver, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	for i := range labelsOver.TextStyle {
		labelsOver.TextStyle[i].XAlign = draw.XCenter
	}
	labelsOver.Offset = vg.Point{Y: vg.Points(4)}
	p.Add(plotter.NewGrid(), bc, labelsOver)
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.75, float64(len(bars))-0.25
	p.X.Label.Text = xLabel
	p.Y.Min, p.Y.Max = 0, math.Max(top, 1)*1.15 // room for the labels
	p.Y.Label.Text = "items/s"
	w, err := p.WriterTo(6*vg.Inch, 4*vg.Inch, format)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot: %w", err)
	}
	return f.Close()
}
