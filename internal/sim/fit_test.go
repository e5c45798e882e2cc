package sim

import (
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
)

// spikes describes a tail of load spikes added to a sample: on a share
// of the items, extra seconds more. repaid: the next items are shorter
// by the lateness until it is made up, as synthetic nodes do (their
// sleeps take a late wake off the next), so the mean stays the body's;
// otherwise the spikes add to the mean, as a real node's would.
type spikes struct {
	share, extra float64
	repaid       bool
}

// sample draws n service times, in seconds: a log-normal body with the
// given median and sigma, and the spikes.
func sample(r *rand.Rand, n int, median, sigma float64, sp spikes) []float64 {
	xs := make([]float64, n)
	var late float64
	for i := range xs {
		x := median * math.Exp(sigma*r.NormFloat64())
		if sp.repaid {
			x, late = max(x-late, 0), max(late-x, 0)
		}
		if r.Float64() < sp.share {
			x += sp.extra
			if sp.repaid {
				late += sp.extra
			}
		}
		xs[i] = x
	}
	return xs
}

// summarize is the runtime's summary of xs: the exact mean, and the p50
// and p99 as the middle of the histogram bucket they fall in (18 a
// doubling from 1 µs, internal/engine's).
func summarize(xs []float64) report.Summary {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	bucket := func(x float64) float64 {
		b := math.Floor(18 * math.Log2(x/1e-6))
		return 1e-6 * math.Exp2((b+0.5)/18)
	}
	return report.Summary{Mean: sum / float64(len(s)), P50: bucket(quantile(s, 0.5)), P99: bucket(quantile(s, 0.99))}
}

// oldFit is the fit the simulator had before fitBody: the measured mean,
// and a sigma through the p50 and the p99.
func oldFit(s report.Summary) (mean, sigma float64) {
	return s.Mean, math.Log(s.P99/s.P50) / z99
}

// stepCost is what a step of three replicas that sync takes on average
// (the slowest of three draws) when each draws from a log-normal with that
// mean and sigma: the cost a sync stage pays for its spread, and what the
// seed's drafters pay. Monte Carlo, with a fixed seed.
func stepCost(mean, sigma float64) float64 {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 50_000
	var sum float64
	for range n {
		z := max(r.NormFloat64(), r.NormFloat64(), r.NormFloat64())
		sum += mean * math.Exp(sigma*z-sigma*sigma/2)
	}
	return sum / n
}

// TestFitBody: a replica's measured figures with a tail of load spikes
// (a p99 of 85-110 ms against a body's 32 ms) fit close to the body's
// cost: the mean, and what a step of three synchronized replicas takes,
// where the old fit, a sigma through the p99, made every item as spread
// as the spikes (a step over 1.3 times the body's). A genuinely spread
// stage, and a tight one without spikes, keep their spread, and an
// exponential one its mean.
func TestFitBody(t *testing.T) {
	const median = 0.025
	for _, tc := range []struct {
		name      string
		sigma     float64
		sp        spikes
		tolMean   float64 // relative, of the fitted mean to the body's
		tolStep   float64 // relative, of the fitted step cost to the body's
		oldMisfit bool    // the old fit's step costs over 1.3 times the body's
	}{
		{"tight, no spikes", 0.1, spikes{}, 0.02, 0.03, false},
		{"spread, no spikes", 0.5, spikes{}, 0.03, 0.05, false},
		{"3% spikes repaid", 0.1, spikes{0.03, 0.085, true}, 0.02, 0.1, true},
		{"8% spikes repaid", 0.1, spikes{0.08, 0.085, true}, 0.02, 0.15, true},
		{"1.2% spikes not repaid", 0.1, spikes{0.012, 0.085, false}, 0.04, 0.2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			measured := summarize(sample(rand.New(rand.NewPCG(1, 2)), 4000, median, tc.sigma, tc.sp))
			bodyMean := median * math.Exp(tc.sigma*tc.sigma/2)
			bodyStep := stepCost(bodyMean, tc.sigma)
			mean, sigma := fitBody(measured)
			step := stepCost(mean, sigma)
			old := stepCost(oldFit(measured))
			t.Logf("measured %+v: fit mean %.2fms sigma %.3f, a step %.2fms; the body's %.2fms, %.2fms; the old fit's step %.2fms",
				measured, 1e3*mean, sigma, 1e3*step, 1e3*bodyMean, 1e3*bodyStep, 1e3*old)
			if math.Abs(mean/bodyMean-1) > tc.tolMean {
				t.Errorf("fitted mean %.2fms, the body's %.2fms: more than %.0f%% apart", 1e3*mean, 1e3*bodyMean, 100*tc.tolMean)
			}
			if math.Abs(step/bodyStep-1) > tc.tolStep {
				t.Errorf("fitted step %.2fms, the body's %.2fms: more than %.0f%% apart", 1e3*step, 1e3*bodyStep, 100*tc.tolStep)
			}
			if (old > 1.3*bodyStep) != tc.oldMisfit {
				t.Errorf("the old fit's step %.2fms against the body's %.2fms: misfit %v, want %v", 1e3*old, 1e3*bodyStep, !tc.oldMisfit, tc.oldMisfit)
			}
		})
	}
	// A body shaped otherwise, exponential (fan.hcl's), without spikes: a
	// replay keeps its measured mean, the cost that sets throughput.
	r := rand.New(rand.NewPCG(7, 8))
	xs := make([]float64, 4000)
	for i := range xs {
		xs[i] = 0.01 * r.ExpFloat64()
	}
	exp := summarize(xs)
	if mean, _ := fitBody(exp); math.Abs(mean/exp.Mean-1) > 0.005 {
		t.Errorf("exponential %+v: fitted mean %.3fms, measured %.3fms", exp, 1e3*mean, 1e3*exp.Mean)
	}
	// Figures too few to fit a spread: the mean, no spread.
	for _, s := range []report.Summary{{Mean: 0.01}, {Mean: 0.01, P50: 0.01, P99: 0.01}, {}} {
		if mean, sigma := fitBody(s); mean != s.Mean || sigma != 0 {
			t.Errorf("%+v: fitted %v, %v; want the mean, no spread", s, mean, sigma)
		}
	}
}

// withService returns a copy of rep whose replicas of the named stages
// have the given summaries.
func withService(rep *report.Report, service map[string][]report.Summary) *report.Report {
	out := *rep
	out.Stages = map[string]report.Stage{}
	for name, st := range rep.Stages {
		st.Replicas = append([]report.Replica(nil), st.Replicas...)
		for i, s := range service[name] {
			st.Replicas[i].ServiceSeconds = s
		}
		out.Stages[name] = st
	}
	return &out
}

// TestPredictorIgnoresSpikes: the seed's estimate from two reports that
// differ only by a tail of load spikes agrees within 3%: the figures of a
// quiet and of a loaded real run of the seed (3000 items; two busy loops
// beside the loaded one on 2 cores), whose drafters' p99 went from 37 ms
// to 81 ms (the old fit's estimate went from 1.67x to 1.35x), and samples
// with 3% of the items spiked, repaid as synthetic nodes do, or on 1.2%
// of the items, not repaid. Every estimate's range holds it.
func TestPredictorIgnoresSpikes(t *testing.T) {
	g := loadSeed(t)
	base, err := Run(g, Options{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	ms := func(figs ...[3]float64) []report.Summary {
		var out []report.Summary
		for _, f := range figs {
			out = append(out, report.Summary{Mean: f[0] / 1e3, P50: f[1] / 1e3, P99: f[2] / 1e3})
		}
		return out
	}
	quiet := map[string][]report.Summary{
		"target":  ms([3]float64{49.626, 49.097, 61.858}, [3]float64{50.076, 49.097, 69.433}, [3]float64{49.95, 49.097, 66.81}, [3]float64{49.586, 49.097, 64.286}, [3]float64{49.83, 49.097, 66.81}),
		"drafter": ms([3]float64{25.008, 24.548, 37.496}, [3]float64{25.009, 24.548, 37.496}, [3]float64{25.008, 24.548, 38.968}),
	}
	loaded := map[string][]report.Summary{
		"target":  ms([3]float64{49.597, 49.097, 119.042}, [3]float64{50.097, 49.097, 119.042}, [3]float64{49.94, 49.097, 123.715}, [3]float64{49.632, 49.097, 119.042}, [3]float64{49.818, 49.097, 119.042}),
		"drafter": ms([3]float64{25.005, 24.548, 80.996}, [3]float64{25.008, 24.548, 80.996}, [3]float64{25.017, 24.548, 84.175}),
	}
	sampled := func(sp spikes) map[string][]report.Summary {
		r := rand.New(rand.NewPCG(3, 4))
		out := map[string][]report.Summary{}
		for range 5 {
			out["target"] = append(out["target"], summarize(sample(r, 1000, 0.05, 0.1, sp)))
		}
		for range 3 {
			out["drafter"] = append(out["drafter"], summarize(sample(r, 1000, 0.025, 0.02, sp)))
		}
		return out
	}
	predict := func(service map[string][]report.Summary) monitor.Prediction {
		t.Helper()
		p, ok := Predictor(g, Options{Registry: registry(), From: withService(base, service)})("hs")
		if !ok {
			t.Fatal("no prediction")
		}
		if x := p.Before / p.After; p.Low > x || p.High < x || p.Low >= p.High {
			t.Errorf("%+v: the speedup %.3f is not within its range", p, x)
		}
		return p
	}
	for _, tc := range []struct {
		name        string
		calm, spiky map[string][]report.Summary
	}{
		{"a quiet and a loaded run", quiet, loaded},
		{"3% spikes repaid", sampled(spikes{}), sampled(spikes{0.03, 0.085, true})},
		{"1.2% spikes not repaid", sampled(spikes{}), sampled(spikes{0.012, 0.085, false})},
	} {
		a, b := predict(tc.calm), predict(tc.spiky)
		xa, xb := a.Before/a.After, b.Before/b.After
		t.Logf("%s: %.3fx (%.3f-%.3f) against %.3fx (%.3f-%.3f)", tc.name, xa, a.Low, a.High, xb, b.Low, b.High)
		if math.Abs(xb/xa-1) > 0.03 {
			t.Errorf("%s: %.3fx against %.3fx: more than 3%% apart", tc.name, xa, xb)
		}
	}
}

// TestPredictorSpread: replaying a report, the estimate has a spread
// around it, a few percent wide for the seed, and the diagnosis prints
// it; from the nodes' own seeded models the fits draw alike and there is
// none.
func TestPredictorSpread(t *testing.T) {
	g := loadSeed(t)
	opts := Options{Registry: registry()}
	rep, err := Run(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := Predictor(g, opts)("hs")
	if x := p.Before / p.After; !ok || math.Abs(p.Low/x-1) > 1e-9 || math.Abs(p.High/x-1) > 1e-9 {
		t.Errorf("from the models: %+v, want no spread", p)
	}
	p, ok = Predictor(g, Options{Registry: registry(), From: rep})("hs")
	if x := p.Before / p.After; !ok || p.Low > x || p.High < x || p.Low >= p.High || p.High/p.Low > 1.1 {
		t.Errorf("replayed: %+v, want a spread of under 10%% around %.3f", p, x)
	}
	diag := strings.Join(monitor.Diagnose(g, rep, Predictor(g, Options{Registry: registry(), From: rep})), "\n")
	if !regexp.MustCompile(`policy = "shared" balances it \(simulated: 1\.\d\dx faster \(1\.\d\d-1\.\d\dx\), \d+\.\d\ds -> \d+\.\d\ds\)`).MatchString(diag) {
		t.Errorf("the diagnosis lacks the estimate's range:\n%s", diag)
	}
}
