package graph

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Distribution is a service time: a fixed Go duration ("40ms") or a random
// one. The forms are
//
//	40ms                    always 40ms
//	uniform(10ms, 30ms)     uniform between the bounds
//	exponential(40ms)       exponential with mean 40ms
//	normal(40ms, 5ms)       normal with mean and standard deviation, cut at 0
//	lognormal(40ms, 0.2)    log-normal with mean 40ms and log-space sigma 0.2
//
// A Distribution is an immutable value; Sample draws from a caller's
// source so that each replica can have its own seeded stream.
type Distribution struct {
	Kind   string // "const", "uniform", "exponential", "normal", "lognormal"
	A, B   time.Duration
	Sigma  float64 // lognormal only
	source string
}

// ParseDistribution parses a service_time value.
func ParseDistribution(s string) (Distribution, error) {
	s = strings.TrimSpace(s)
	name, args, ok := strings.Cut(s, "(")
	if !ok {
		d, err := parseDuration(s)
		if err != nil {
			return Distribution{}, err
		}
		return Distribution{Kind: "const", A: d, source: s}, nil
	}
	if !strings.HasSuffix(args, ")") {
		return Distribution{}, fmt.Errorf("%q: missing closing parenthesis", s)
	}
	parts := strings.Split(strings.TrimSuffix(args, ")"), ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	d := Distribution{Kind: strings.TrimSpace(name), source: s}
	want := map[string]int{"uniform": 2, "exponential": 1, "normal": 2, "lognormal": 2}[d.Kind]
	if want == 0 {
		return Distribution{}, fmt.Errorf("%q: unknown distribution %q%s; use uniform, exponential, normal or lognormal",
			s, d.Kind, DidYouMean(d.Kind, []string{"uniform", "exponential", "normal", "lognormal"}))
	}
	if len(parts) != want {
		return Distribution{}, fmt.Errorf("%q: %s takes %d arguments, got %d", s, d.Kind, want, len(parts))
	}
	var err error
	if d.A, err = parseDuration(parts[0]); err != nil {
		return Distribution{}, err
	}
	switch d.Kind {
	case "uniform", "normal":
		if d.B, err = parseDuration(parts[1]); err != nil {
			return Distribution{}, err
		}
		if d.Kind == "uniform" && d.B < d.A {
			return Distribution{}, fmt.Errorf("%q: the upper bound is below the lower", s)
		}
	case "lognormal":
		d.Sigma, err = strconv.ParseFloat(parts[1], 64)
		if err != nil || d.Sigma < 0 || math.IsInf(d.Sigma, 0) || math.IsNaN(d.Sigma) {
			return Distribution{}, fmt.Errorf("%q: sigma must be a number >= 0, like 0.2", s)
		}
	}
	return d, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 40ms or 1.5s", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: a service time cannot be negative", s)
	}
	return d, nil
}

// CheckServiceTime reports whether s is a valid service_time.
func CheckServiceTime(s string) error {
	_, err := ParseDistribution(s)
	return err
}

func (d Distribution) String() string { return d.source }

// Mean returns the distribution's mean (for normal, ignoring the cut at 0).
func (d Distribution) Mean() time.Duration {
	switch d.Kind {
	case "uniform":
		return (d.A + d.B) / 2
	}
	return d.A
}

// Sample draws one service time.
func (d Distribution) Sample(r *rand.Rand) time.Duration {
	switch d.Kind {
	case "uniform":
		return d.A + time.Duration(r.Float64()*float64(d.B-d.A))
	case "exponential":
		return time.Duration(r.ExpFloat64() * float64(d.A))
	case "normal":
		return max(0, d.A+time.Duration(r.NormFloat64()*float64(d.B)))
	case "lognormal":
		mu := math.Log(float64(d.A)) - d.Sigma*d.Sigma/2
		return time.Duration(math.Exp(mu + d.Sigma*r.NormFloat64()))
	}
	return d.A
}
