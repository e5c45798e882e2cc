package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/dflow-dev/dflow/report"
)

// A measured run's service times (Options.From) reach the simulator as
// each replica's summary: the exact mean, and the p50 and p99 read from
// the runtime's histogram. On a loaded machine some items take far longer
// than the stage's work (a process not scheduled for tens of
// milliseconds): a tail of such spikes sets the p99 on its own, and a
// log-normal fitted through the p99 makes every item of the stage as
// spread out as the spikes. The fit below takes the body of the
// distribution instead.

// z99 is the standard normal's 0.99 quantile.
const z99 = 2.326

// quantilePrecision is how far, in log space, a reported quantile may be
// from the true one: the runtime's histogram has 18 buckets a doubling
// (about 4% wide) and reports a bucket's middle.
const quantilePrecision = math.Ln2 / 36

// fitBody fits a log-normal to the body of a measured service-time
// distribution, given as its summary, and returns its mean and log-space
// sigma.
//
// The median is the body's: a few slow items do not move it. The spread
// shows twice in the summary. The slowest 1% of the items take at least
// the p99, so the other 99% take at most (mean - p99/100) / 0.99 on
// average: the mean with the tail trimmed. A log-normal's spread sets both
// its p99 (p99/p50 = exp(2.326 sigma)) and that trimmed mean over its p50
// (trimmedRatio). A genuinely spread stage raises both alike; a tail of
// load spikes sets the p99 on its own and raises the trimmed mean little,
// for the spikes are few. The smaller sigma is the body's: a tail the mean
// does not carry is not the stage's cost. The fitted mean is the measured
// one, but no more than that of a log-normal with that sigma whose fastest
// 99% average the trimmed mean (to the histogram's precision): the spikes'
// share of the mean is left out with them, and a body shaped otherwise
// than a log-normal (an exponential's) keeps its measured mean.
func fitBody(s report.Summary) (mean, sigma float64) {
	if s.Mean <= 0 {
		return 0, 0
	}
	trimmed := (s.Mean - s.P99/100) / 0.99
	if s.P50 <= 0 || trimmed <= 0 {
		return s.Mean, 0
	}
	if s.P99 > s.P50 {
		sigma = min(math.Log(s.P99/s.P50)/z99, trimmedSigma(trimmed/s.P50))
	}
	return min(s.Mean, trimmed/trimmedRatio(sigma)*math.Exp(sigma*sigma/2+quantilePrecision)), sigma
}

// trimmedRatio is a log-normal's mean over its fastest 99% (the slowest
// 1% left out) over its median: exp(sigma²/2) Φ(z99 - sigma) / 0.99.
func trimmedRatio(sigma float64) float64 {
	return math.Exp(sigma*sigma/2) * 0.5 * math.Erfc(-(z99-sigma)/math.Sqrt2) / 0.99
}

// trimmedSigma is the sigma whose trimmedRatio is r; 0 for r <= 1 (the
// ratio dips below 1 by under 0.03% for sigma under 0.07, far below what
// a measured figure tells). Above 1 the ratio rises with sigma.
func trimmedSigma(r float64) float64 {
	if r <= 1 {
		return 0
	}
	lo, hi := 0.0, 5.0
	if trimmedRatio(hi) <= r {
		return hi
	}
	for range 60 {
		mid := (lo + hi) / 2
		if trimmedRatio(mid) < r {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// redraw returns a summary the measured one could as well have been: its
// quantiles anywhere within the histogram's precision, and each figure
// moved by its sampling error over n items under the fitted sigma (a
// median's is 1.25 sigma/√n in log space, a p99's 3.73 sigma/√n, a mean's
// √(exp(sigma²)-1)/√n). The predictor's alternative fits are made of these.
func redraw(s report.Summary, n int64, r *rand.Rand) report.Summary {
	_, sigma := fitBody(s)
	se := sigma / math.Sqrt(float64(max(n, 1)))
	within := func() float64 { return quantilePrecision * (2*r.Float64() - 1) }
	return report.Summary{
		Mean: s.Mean * math.Exp(math.Sqrt(math.Expm1(sigma*sigma))/math.Sqrt(float64(max(n, 1)))*r.NormFloat64()),
		P50:  s.P50 * math.Exp(within()+1.2533*se*r.NormFloat64()),
		P99:  s.P99 * math.Exp(within()+3.73*se*r.NormFloat64()),
	}
}

// measuredService fits replica i's measured service times (fitBody),
// redrawn (redraw) for an alternative fit (Options.refit). A replica the
// report lacks (more replicas now) takes the stage's average figures.
func (s *sim) measuredService(st report.Stage, si uint64, i int) (time.Duration, float64) {
	var r report.Replica
	if i < len(st.Replicas) {
		r = st.Replicas[i]
	} else {
		for _, x := range st.Replicas {
			n := float64(len(st.Replicas))
			r.ServiceSeconds.Mean += x.ServiceSeconds.Mean / n
			r.ServiceSeconds.P50 += x.ServiceSeconds.P50 / n
			r.ServiceSeconds.P99 += x.ServiceSeconds.P99 / n
			r.ItemsIn += x.ItemsIn / int64(len(st.Replicas))
			r.ItemsOut += x.ItemsOut / int64(len(st.Replicas))
		}
	}
	sum := r.ServiceSeconds
	if s.opts.refit > 0 {
		rng := rand.New(rand.NewPCG(s.opts.Seed^uint64(s.opts.refit)<<32, si<<20|uint64(i)|1<<19))
		sum = redraw(sum, max(r.ItemsIn, r.ItemsOut), rng)
	}
	mean, sigma := fitBody(sum)
	return time.Duration(mean * float64(time.Second)), sigma
}
