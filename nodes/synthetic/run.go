package synthetic

import (
	"context"
	"errors"
	"fmt"
	"github.com/dflow-dev/dflow/items"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
)

// Blob is the payload synthetic_source emits (defined in package items,
// with its wire encoding).
type Blob = items.Blob

// timing is the service-time model shared by the three kinds.
type timing struct {
	dist  graph.Distribution
	speed []float64
	seed  int64
	// A change of cost mid-run (change_after, change_at): from the
	// stage's after-th item, or from at after its start, items take then.
	then     graph.Distribution
	changing bool // then is set
	after    int64
	at       time.Duration
	// shift counts the stage's items and keeps its start, for the
	// change: one per node, so shared by the replicas of the stage in
	// this process.
	shift *shift
}

func newTiming(cfg *graph.Config) (timing, error) {
	d, err := graph.ParseDistribution(cfg.String("service_time"))
	if err != nil {
		return timing{}, err
	}
	t := timing{dist: d, speed: cfg.Floats("speed"), seed: int64(cfg.Int("seed")), shift: &shift{}}
	if s := cfg.String("changed_service_time"); s != "" {
		if t.then, err = graph.ParseDistribution(s); err != nil {
			return timing{}, fmt.Errorf("changed_service_time: %w", err)
		}
		t.changing = true
		t.after = int64(cfg.Int("change_after"))
		if at := cfg.String("change_at"); at != "" {
			if t.at, err = time.ParseDuration(at); err != nil {
				return timing{}, fmt.Errorf("change_at: %w", err)
			}
		}
	}
	return t, nil
}

// changes reports whether an item takes the changed cost: the stage had
// started started items before it, at elapsed after the stage's start.
func (t timing) changes(elapsed time.Duration, started int64) bool {
	if !t.changing {
		return false
	}
	return (t.after > 0 && started >= t.after) || (t.at > 0 && elapsed >= t.at)
}

// shift is a stage's count of items and its start, as its replicas in
// one process see them.
type shift struct {
	once  sync.Once
	start time.Time
	items atomic.Int64
}

// begin marks the stage's start: the first replica's call sets it, and
// every replica calls it before its first draw.
func (s *shift) begin() { s.once.Do(func() { s.start = time.Now() }) }

// clock draws one replica's service times and sleeps them.
type clock struct {
	timing
	replica int
	rng     *rand.Rand
	timer   *time.Timer
	late    time.Duration // how late the last sleep woke
}

// clock returns the service-time stream of one replica of one stage. The
// stream depends on the seed, the stage's name and the replica, so two
// stages with the same seed do not draw the same (correlated) times.
func (t timing) clock(stage string, replica int) *clock {
	h := fnv.New64a()
	h.Write([]byte(stage))
	return &clock{
		timing:  t,
		replica: replica,
		rng:     rand.New(rand.NewPCG(uint64(t.seed), h.Sum64()^uint64(replica))),
	}
}

// Speed returns replica i's speed factor.
func (t timing) Speed(i int) float64 {
	if len(t.speed) == 0 {
		return 1
	}
	return t.speed[i%len(t.speed)]
}

// next draws the replica's next service time, counting it as one of
// the stage's items.
func (c *clock) next() time.Duration {
	if !c.changing {
		return c.draw(false)
	}
	sh := c.shift
	sh.begin()
	return c.draw(c.changes(time.Since(sh.start), sh.items.Add(1)-1))
}

// draw draws one service time, of the changed cost or not.
func (c *clock) draw(changed bool) time.Duration {
	d := c.dist
	if changed {
		d = c.then
	}
	return time.Duration(float64(d.Sample(c.rng)) / c.Speed(c.replica))
}

// work sleeps one service time, or returns ctx.Err().
//
// A timer wakes late (0.1-1ms on a busy machine), which a device does not:
// the lateness of one sleep is taken off the next, so a replica's busy
// time follows its distribution instead of drifting above it.
func (c *clock) work(ctx context.Context) error {
	d := c.next() - c.late
	if d <= 0 {
		c.late = -d
		return ctx.Err()
	}
	due := time.Now().Add(d)
	if c.timer == nil {
		c.timer = time.NewTimer(d)
	} else {
		c.timer.Reset(d)
	}
	select {
	case <-c.timer.C:
		c.late = max(time.Since(due), 0)
		return nil
	case <-ctx.Done():
		c.timer.Stop()
		return ctx.Err()
	}
}

func (c *clock) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

type source struct {
	timing
	count int
	// item makes the replica's seq-th item, of the Go type the port's type
	// means (graph.WireTypes): every item shares one payload, read-only.
	item func(replica int, seq int64) any
	// keyed: the blobs carry keys (the keys config), from Keys
	keyed bool
	cfg   *graph.Config
}

func newSource(cfg *graph.Config) (nodes.Node, error) {
	t, err := newTiming(cfg)
	if err != nil {
		return nil, err
	}
	size := cfg.Int("size_bytes")
	s := &source{timing: t, count: cfg.Int("count")}
	switch typ := cfg.String("type"); typ {
	case "bytes":
		data := make([]byte, size)
		s.item = func(int, int64) any { return data }
	case "tokens":
		// One row of size_bytes/4 tokens (at least 2: T >= 1), byte values.
		tokens := make([]int32, max(size/4, 2))
		for i := range tokens {
			tokens[i] = int32(i % 256)
		}
		s.item = func(_ int, seq int64) any { return &text.Batch{Tokens: tokens, B: 1, T: len(tokens) - 1, Seq: seq} }
	default:
		if w, ok := graph.LookupWireType(typ); ok && w.Name != "blob" {
			return nil, fmt.Errorf("synthetic_source cannot make %q items (%s)", typ, w.Go)
		}
		data := make([]byte, size)
		s.item = func(replica int, seq int64) any { return &Blob{Replica: replica, Seq: seq, Data: data} }
		s.keyed = cfg.Int("keys") > 0
	}
	s.cfg = cfg
	return s, nil
}

// Share returns how many of count items replica i of n emits.
func Share(count, i, n int) int {
	s := count / n
	if i < count%n {
		s++
	}
	return s
}

func (s *source) Run(ctx context.Context, r nodes.Replica) error {
	s.shift.begin()
	c := s.clock(r.Stage(), r.Index())
	defer c.stop()
	out := r.Out("out")
	n := Share(s.count, r.Index(), r.Replicas())
	var key func(int, int64) string
	if s.keyed {
		key = Keys(s.cfg, r.Replicas())
	}
	for seq := 0; seq < n; seq++ {
		if err := c.work(ctx); err != nil {
			return err
		}
		item := s.item(r.Index(), int64(seq))
		if key != nil {
			item.(*Blob).ItemKey = key(r.Index(), int64(seq))
		}
		if err := out.Send(ctx, item); err != nil {
			return err
		}
	}
	return nil
}

type work struct {
	timing
	sync      bool
	failAfter int
}

func newWork(cfg *graph.Config) (nodes.Node, error) {
	t, err := newTiming(cfg)
	if err != nil {
		return nil, err
	}
	return &work{timing: t, sync: cfg.Bool("sync"), failAfter: cfg.Int("fail_after")}, nil
}

// ErrInjected is the failure fail_after injects.
var ErrInjected = errors.New("injected failure")

func (w *work) Run(ctx context.Context, r nodes.Replica) error {
	w.shift.begin()
	c := w.clock(r.Stage(), r.Index())
	defer c.stop()
	in, out := r.In("in"), r.Out("out")
	group := r.Group()
	defer group.Leave()
	for done := 0; ; done++ {
		if w.failAfter > 0 && done == w.failAfter {
			return fmt.Errorf("%w after %d items (fail_after = %d)", ErrInjected, done, w.failAfter)
		}
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if w.sync {
			if err := group.Barrier(ctx); err != nil {
				return err
			}
		}
		if err := c.work(ctx); err != nil {
			return err
		}
		if err := out.Send(ctx, item); err != nil {
			return err
		}
	}
}

type sink struct{ timing }

func newSink(cfg *graph.Config) (nodes.Node, error) {
	t, err := newTiming(cfg)
	if err != nil {
		return nil, err
	}
	return &sink{timing: t}, nil
}

func (s *sink) Run(ctx context.Context, r nodes.Replica) error {
	s.shift.begin()
	c := s.clock(r.Stage(), r.Index())
	defer c.stop()
	in := r.In("in")
	for {
		_, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := c.work(ctx); err != nil {
			return err
		}
	}
}

// simModel gives the simulator the same service-time streams the replicas
// sleep, with the change of cost at the same item of the stage or the
// same time after its start, plus sync and fail_after, and a source's
// item size, keys and split of its items over its replicas.
func simModel(cfg *graph.Config) (*nodes.SimModel, error) {
	t, err := newTiming(cfg)
	if err != nil {
		return nil, err
	}
	var at func(stage string, replica int) func(time.Duration, int64) time.Duration
	if t.changing {
		at = func(stage string, replica int) func(time.Duration, int64) time.Duration {
			c := t.clock(stage, replica)
			return func(elapsed time.Duration, started int64) time.Duration { return c.draw(t.changes(elapsed, started)) }
		}
	}
	return &nodes.SimModel{
		Service:   func(stage string, replica int) func() time.Duration { return t.clock(stage, replica).next },
		ServiceAt: at,
		Sync:      cfg.Bool("sync"),
		FailAfter: cfg.Int("fail_after"),
		ItemBytes: int64(cfg.Int("size_bytes")), // only a source's config has it
		Keys: func(replicas int) func(int, int64) string {
			return Keys(cfg, replicas) // the very keys its replicas give; nil without keys
		},
		Share: func(total int64, i, n int) int64 { return int64(Share(int(total), i, n)) },
	}, nil
}
