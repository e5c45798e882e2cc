package engine

import (
	"math"
	"sync/atomic"
	"time"
)

// histogram records durations in log-spaced buckets (about 4% wide) with
// atomics: no lock and no allocation per observation. Quantiles are read
// to bucket precision; the mean is exact.
type histogram struct {
	count   atomic.Int64
	sum     atomic.Int64 // ns
	buckets [histBuckets]atomic.Int64
}

const (
	histBuckets = 640
	histPerOct  = 18 // buckets per doubling: 2^(1/18) ≈ 1.039
)

func bucketOf(d time.Duration) int {
	if d < time.Microsecond {
		return 0
	}
	// log2 from the float's exponent and a cubic fit of log2 on the
	// mantissa [1, 2): within 0.01 of math.Log2, far below a bucket.
	frac, exp := math.Frexp(float64(d) / float64(time.Microsecond))
	m := 2*frac - 1 // in [0, 1)
	l := float64(exp-1) + m*(1.4425-m*(0.6938-m*0.2513))
	return min(1+int(l*histPerOct), histBuckets-1)
}

// bucketMid is a representative duration of bucket b.
func bucketMid(b int) time.Duration {
	if b == 0 {
		return 0
	}
	return time.Duration(float64(time.Microsecond) * math.Exp2((float64(b)-0.5)/histPerOct))
}

func (h *histogram) observe(d time.Duration) {
	h.count.Add(1)
	h.sum.Add(int64(d))
	h.buckets[bucketOf(d)].Add(1)
}

// mean returns the exact mean, 0 with no observations.
func (h *histogram) mean() time.Duration {
	n := h.count.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// quantile returns the q-quantile (0 < q <= 1) to bucket precision.
func (h *histogram) quantile(q float64) time.Duration {
	n := h.count.Load()
	if n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for b := range h.buckets {
		seen += h.buckets[b].Load()
		if seen >= rank {
			return bucketMid(b)
		}
	}
	return bucketMid(histBuckets - 1)
}
