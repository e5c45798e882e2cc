package synthetic

import (
	"fmt"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/zclconf/go-cty/cty"
)

func init() { Register(nodes.Default) }

// Register adds the synthetic kinds to a registry.
func Register(r *nodes.Registry) {
	// A source's items and service times follow from its config and seed:
	// a lost replica resumes where it was (nodes.Spec.Resumes).
	r.Register(nodes.Spec{Kind: sourceKind, New: newSource, Sim: simModel, Resumes: true,
		Total: func(cfg *graph.Config) int64 { return int64(cfg.Int("count")) }})
	r.Register(nodes.Spec{Kind: workKind, New: newWork, Sim: simModel, Stateless: true, OneForOne: true})
	r.Register(nodes.Spec{Kind: sinkKind, New: newSink, Sim: simModel, Stateless: true})
}

var (
	fieldServiceTime = graph.Field{Name: "service_time", Type: graph.String, Default: cty.StringVal("0s"),
		Doc: `time per item: a Go duration or a distribution such as "lognormal(40ms, 0.2)"`}
	fieldSpeed = graph.Field{Name: "speed", Type: graph.NumberList,
		Doc: "one factor per replica: replica i takes service_time / speed[i % len(speed)]"}
	fieldSeed = graph.Field{Name: "seed", Type: graph.Int, Default: cty.NumberIntVal(1),
		Doc: "seed of the service-time draws; replica i uses seed+i"}
	// A cost that changes mid-run: a workload whose bottleneck moves.
	fieldChangeAfter = graph.Field{Name: "change_after", Type: graph.Int, Default: cty.NumberIntVal(0),
		Doc: "the stage's items (over its replicas in one process: on a cluster, each worker counts its own) after which each takes changed_service_time; 0: no change by count"}
	fieldChangeAt = graph.Field{Name: "change_at", Type: graph.String, Default: cty.StringVal(""),
		Doc: `the time after the stage's start ("30s") from which each item takes changed_service_time; "": no change by time`}
	fieldChanged = graph.Field{Name: "changed_service_time", Type: graph.String, Default: cty.StringVal(""),
		Doc: "service_time from the change (change_after or change_at) on; speed applies to it too"}
)

// timingFields are the config of every synthetic kind's service times.
var timingFields = []graph.Field{fieldServiceTime, fieldSpeed, fieldSeed, fieldChangeAfter, fieldChangeAt, fieldChanged}

var sourceKind = graph.Kind{
	Name: "synthetic_source",
	Doc:  "Emits count items in all, split over its replicas, each after one service time.",
	Config: []graph.Field{
		{Name: "count", Type: graph.Int, Required: true, Doc: "items to emit in all, split over the replicas"},
		{Name: "size_bytes", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "payload size of each item"},
		{Name: "type", Type: graph.String, Default: cty.StringVal("blob"),
			Doc: `the type of the out port and its items: "blob" (*items.Blob of size_bytes), "bytes" ([]byte of size_bytes), "tokens" (*items.Batch of size_bytes/4 tokens, one row), or a name of your own (blobs under that name)`},
		{Name: "keys", Type: graph.Int, Default: cty.NumberIntVal(0),
			Doc: `give the items keys (for key_hash edges): N distinct keys "k0".."k{N-1}", taking turns; 0 for none`},
		{Name: "key_skew", Type: graph.Number, Default: cty.NumberIntVal(0),
			Doc: `with keys: 0 for keys taking turns, s > 0 for keys drawn with probability 1/(k+1)^s (Zipf, "k0" the most frequent)`},
		fieldServiceTime, fieldSpeed, fieldSeed, fieldChangeAfter, fieldChangeAt, fieldChanged,
	},
	Ports: func(cfg *graph.Config) []graph.PortSpec {
		out := graph.PortSpec{Name: "out", Dir: graph.Out, Type: cfg.String("type"), Doc: "the generated items"}
		switch t := cfg.String("type"); {
		case t == "bytes" || t == "tokens": // only blobs carry keys
			out.NoKeys, out.NoKeysField = fmt.Sprintf("type %q items carry none (keyed items are blobs: type \"blob\" with keys = N)", t), "type"
		case cfg.Int("keys") == 0:
			out.NoKeys, out.NoKeysField = "keys = 0 gives them none (keys = N gives N distinct keys)", "keys"
		}
		return []graph.PortSpec{out}
	},
	Check: func(cfg *graph.Config) []error {
		errs := checkTiming(cfg)
		errs = append(errs, nonNegative(cfg, "count", "size_bytes")...)
		errs = append(errs, checkKeys(cfg)...)
		if t := cfg.String("type"); t == "" || t == graph.Any {
			errs = append(errs, &graph.FieldError{Field: "type", Err: fmt.Errorf("must name a concrete type, not %q", t)})
		} else if w, ok := graph.LookupWireType(t); ok && !emits[w.Name] {
			// A port type means one Go type: a source that emitted blobs
			// under it would hand its consumers items they cannot use.
			errs = append(errs, &graph.FieldError{Field: "type", Err: fmt.Errorf(
				"%q items are %s (from %s), which synthetic_source cannot make; use \"blob\", \"bytes\", \"tokens\" or a name of your own", t, w.Go, w.Doc)})
		}
		return errs
	},
}

// emits are the wire types (graph.WireTypes) whose Go type synthetic_source
// makes; any other name of its own carries blobs.
var emits = map[string]bool{"blob": true, "bytes": true, "tokens": true}

var workKind = graph.Kind{
	Name: "synthetic_work",
	Doc:  "Takes one service time per item and passes it on; with sync its replicas step together.",
	Config: []graph.Field{
		fieldServiceTime, fieldSpeed, fieldSeed,
		{Name: "sync", Type: graph.Bool, Default: cty.False,
			Doc: "replicas step together through the replica group, as data-parallel training does"},
		{Name: "fail_after", Type: graph.Int, Default: cty.NumberIntVal(0),
			Doc: "each replica fails after this many items (0: never); for failure tests"},
		fieldChangeAfter, fieldChangeAt, fieldChanged,
	},
	Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{
			{Name: "in", Dir: graph.In, Type: graph.Any, Doc: "items of any type"},
			{Name: "out", Dir: graph.Out, SameAs: "in", Doc: "the same items, unchanged"},
		}
	},
	Check: func(cfg *graph.Config) []error {
		return append(checkTiming(cfg), nonNegative(cfg, "fail_after")...)
	},
}

var sinkKind = graph.Kind{
	Name:   "sink",
	Doc:    "Consumes and drops every item.",
	Config: timingFields,
	Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any, Doc: "items of any type"}}
	},
	Check: checkTiming,
}

func checkTiming(cfg *graph.Config) []error {
	var errs []error
	if err := graph.CheckServiceTime(cfg.String("service_time")); err != nil {
		errs = append(errs, &graph.FieldError{Field: "service_time", Err: err})
	}
	for i, s := range cfg.Floats("speed") {
		if !(s > 0) {
			errs = append(errs, &graph.FieldError{Field: "speed",
				Err: fmt.Errorf("speed[%d] is %g; every factor must be above 0", i, s)})
		}
	}
	if cfg.Has("speed") && len(cfg.Floats("speed")) == 0 {
		errs = append(errs, &graph.FieldError{Field: "speed", Err: fmt.Errorf("must list at least one factor")})
	}
	return append(errs, checkChange(cfg)...)
}

// checkChange checks a change of cost mid-run: changed_service_time and
// exactly one of change_after and change_at go together.
func checkChange(cfg *graph.Config) []error {
	var errs []error
	after, at, then := cfg.Int("change_after"), cfg.String("change_at"), cfg.String("changed_service_time")
	if after < 0 {
		errs = append(errs, &graph.FieldError{Field: "change_after", Err: fmt.Errorf("must be 0 (no change) or more; got %d", after)})
	}
	if at != "" {
		if d, err := time.ParseDuration(at); err != nil || d <= 0 {
			errs = append(errs, &graph.FieldError{Field: "change_at",
				Err: fmt.Errorf("must be a duration above 0 after the stage's start, such as \"30s\"; got %q", at)})
		}
	}
	switch {
	case after > 0 && at != "":
		errs = append(errs, &graph.FieldError{Field: "change_at", Err: fmt.Errorf("give change_after (items) or change_at (a time), not both")})
	case then != "":
		if err := graph.CheckServiceTime(then); err != nil {
			errs = append(errs, &graph.FieldError{Field: "changed_service_time", Err: err})
		}
		if after == 0 && at == "" {
			errs = append(errs, &graph.FieldError{Field: "changed_service_time",
				Err: fmt.Errorf("says what the cost changes to, and needs change_after = N (items) or change_at = \"30s\" to say when")})
		}
	case after > 0:
		errs = append(errs, &graph.FieldError{Field: "change_after", Err: fmt.Errorf("needs changed_service_time, the cost from the change on")})
	case at != "":
		errs = append(errs, &graph.FieldError{Field: "change_at", Err: fmt.Errorf("needs changed_service_time, the cost from the change on")})
	}
	return errs
}

func nonNegative(cfg *graph.Config, names ...string) []error {
	var errs []error
	for _, n := range names {
		if cfg.Int(n) < 0 {
			errs = append(errs, &graph.FieldError{Field: n, Err: fmt.Errorf("must be 0 or more; got %d", cfg.Int(n))})
		}
	}
	return errs
}
