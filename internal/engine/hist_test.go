package engine

import (
	"math"
	"testing"
	"time"
)

// TestBucketOf: the fast log2 puts durations in the bucket math.Log2 would,
// give or take one, and quantiles come back within a bucket's width.
func TestBucketOf(t *testing.T) {
	t.Parallel()
	for d := time.Microsecond; d < time.Hour; d = d*21/20 + 1 {
		exact := 1 + int(math.Log2(float64(d)/float64(time.Microsecond))*histPerOct)
		if got := bucketOf(d); got < exact-1 || got > exact+1 {
			t.Fatalf("bucketOf(%v) = %d, exact %d", d, got, exact)
		}
	}
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.observe(time.Duration(i) * time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 500 * time.Millisecond, 0.99: 990 * time.Millisecond} {
		if got := h.quantile(q); math.Abs(float64(got-want))/float64(want) > 0.06 {
			t.Errorf("quantile(%v) = %v, want about %v", q, got, want)
		}
	}
	if h.mean() != 500500*time.Microsecond {
		t.Errorf("mean = %v", h.mean())
	}
}
