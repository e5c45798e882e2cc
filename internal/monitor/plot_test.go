package monitor

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/report"
)

// starved is the seed's picture at its plainest: hs[2] and trained at 0
// for the whole run, hs[0] and hs[1] full and equal.
func starved() *report.Report {
	rep := &report.Report{Spec: "seed.hcl", Status: report.OK, WallSeconds: 5,
		Stages: map[string]report.Stage{"drafter": {Replicas: make([]report.Replica, 3)}}}
	for i := range 10 {
		rep.Series = append(rep.Series, report.Sample{
			T:           float64(i+1) / 2,
			Queues:      map[string][]int{"hs": {8, 8, 0}, "trained": {0}},
			Utilization: map[string][]float64{"drafter": {0.5, 0.5, 0.5}},
			Idle:        map[string][]float64{"drafter": {0, 0, 0.5}},
		})
	}
	return rep
}

// countColor counts the pixels of exactly c left of column maxX.
func countColor(img image.Image, c color.Color, maxX int) int {
	r0, g0, b0, _ := c.RGBA()
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < min(maxX, b.Max.X); x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if r>>8 == r0>>8 && g>>8 == g0>>8 && b>>8 == b0>>8 {
				n++
			}
		}
	}
	return n
}

// TestPlotShowsCoincidingSeries: series lying on each other (two full
// queues, the starved queue and an idle sink queue both at 0, three
// drafters in lockstep) each leave their own colour in the data area, not
// only in the legend; the legend stands right of the data.
func TestPlotShowsCoincidingSeries(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "p.png")
	if err := Plot(starved(), path); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The legends' column: right of every panel's data area.
	dataRight := img.Bounds().Dx() * 3 / 4
	for i, name := range []string{"hs[0]", "hs[1]", "hs[2]", "trained"} {
		if n := countColor(img, lineColor(i), dataRight); n < 200 {
			t.Errorf("queue line %s (colour %v): %d pixels in the data area, hidden under another line", name, lineColor(i), n)
		}
		if n := countColor(img, lineColor(i), img.Bounds().Dx()) - countColor(img, lineColor(i), dataRight); n == 0 {
			t.Errorf("queue line %s: no legend entry right of the data", name)
		}
	}
}

// TestImageFormats: the extension picks PNG or JPEG; anything else is
// refused before drawing.
func TestImageFormats(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"a.png", "a.PNG", "a.jpg", "a.jpeg"} {
		path := filepath.Join(dir, name)
		if err := Plot(starved(), path); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := os.ReadFile(path)
		var err error
		if strings.HasSuffix(strings.ToLower(name), ".png") {
			_, err = png.Decode(bytes.NewReader(b))
		} else {
			_, err = jpeg.Decode(bytes.NewReader(b))
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := BarChart([]Bar{{Label: "shared", Value: 99, Note: "1.6x"}}, "t", "policy", path); err != nil {
			t.Errorf("bar chart %s: %v", name, err)
		}
	}
	for _, name := range []string{"a.gif", "a.svg", "a"} {
		path := filepath.Join(dir, name)
		if err := Plot(starved(), path); err == nil || !strings.Contains(err.Error(), ".png, .jpg or .jpeg") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("%s was written", name)
		}
	}
}
