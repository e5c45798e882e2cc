package synthetic

import (
	"fmt"
	"math"
	"sort"
	"strconv"

	"github.com/dflow-dev/dflow/graph"
)

// MaxKeys bounds synthetic_source's keys config.
const MaxKeys = 1 << 20

// Keys returns the key of each item a synthetic_source stage emits, as a
// function of the emitting replica and the item's sequence number within
// it, or nil when the config gives no keys (keys = 0). The keys are "k0"
// to "k{keys-1}". With key_skew = 0 they take turns: the replica's seq-th
// item, the (seq*replicas + replica)-th of the stage, has key number
// (seq*replicas + replica) mod keys, so every key gets its share. With
// key_skew = s > 0 key number k is drawn with probability proportional to
// 1/(k+1)^s (Zipf: "k0" the most frequent), from a hash of seed, replica
// and seq. Either way the key depends on nothing else, so a run and its
// simulation (internal/sim calls Keys too) give every item the same key.
func Keys(cfg *graph.Config, replicas int) func(replica int, seq int64) string {
	n := cfg.Int("keys")
	if n <= 0 {
		return nil
	}
	names := make([]string, min(n, 1<<16))
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	name := func(k int) string {
		if k < len(names) {
			return names[k]
		}
		return "k" + strconv.Itoa(k)
	}
	skew := cfg.Float("key_skew")
	if skew == 0 {
		return func(replica int, seq int64) string {
			return name(int((seq*int64(replicas) + int64(replica)) % int64(n)))
		}
	}
	cum := make([]float64, n)
	total := 0.0
	for k := range cum {
		total += math.Pow(float64(k+1), -skew)
		cum[k] = total
	}
	seed := uint64(cfg.Int("seed"))
	return func(replica int, seq int64) string {
		u := float64(mix(seed, uint64(replica), uint64(seq))>>11) / (1 << 53) * total
		return name(min(sort.SearchFloat64s(cum, u), n-1))
	}
}

// mix is splitmix64's finalizer over the three words: a stable uniform
// draw per (seed, replica, seq).
func mix(a, b, c uint64) uint64 {
	z := a*0x9e3779b97f4a7c15 ^ b*0xbf58476d1ce4e5b9 ^ c*0x94d049bb133111eb
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}

func checkKeys(cfg *graph.Config) []error {
	var errs []error
	if n := cfg.Int("keys"); n < 0 || n > MaxKeys {
		errs = append(errs, &graph.FieldError{Field: "keys", Err: fmt.Errorf("must be 0 (no keys) to %d; got %d", MaxKeys, n)})
	} else if n > 0 {
		switch t := cfg.String("type"); t {
		case "bytes", "tokens":
			errs = append(errs, &graph.FieldError{Field: "keys", Err: fmt.Errorf(
				"%q items cannot carry a key; keyed items are blobs (type \"blob\" or a name of your own)", t)})
		}
	}
	if s := cfg.Float("key_skew"); !(s >= 0) || math.IsInf(s, 0) {
		errs = append(errs, &graph.FieldError{Field: "key_skew", Err: fmt.Errorf("must be 0 (even) or more; got %g", s)})
	} else if s > 0 && cfg.Int("keys") == 0 {
		errs = append(errs, &graph.FieldError{Field: "key_skew", Err: fmt.Errorf("needs keys = N")})
	}
	return errs
}
