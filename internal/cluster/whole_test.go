package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// tallyState is a tally replica's state: how many times the group has
// trained on each item, by its sequence number, and the steps taken.
type tallyState struct {
	Counts []int `json:"counts"`
	Step   int   `json:"step"`
}

func (s *tallyState) MarshalBinary() ([]byte, error) { return json.Marshal(s) }
func (s *tallyState) UnmarshalBinary(b []byte) error { return json.Unmarshal(b, s) }

// tallyStore is where a tally group saves: by step, and the final save.
// A replica whose run was cancelled (its worker killed) writes nothing,
// as a killed process writes nothing.
type tallyStore struct {
	mu    sync.Mutex
	saves map[int][]byte
	final []byte
	// finals counts the final saves, written by a group's last member
	finals int
}

func (s *tallyStore) save(ctx context.Context, step int, st *tallyState, final bool) {
	b, _ := st.MarshalBinary()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	if final {
		s.final, s.finals = b, s.finals+1
		return
	}
	s.saves[step] = b
}

// tallyKind is a group that trains on each item in one step, as
// drafter_train does: the step sums a vector with a 1 at each member's
// item, every member adds the sum to its tally, and the lead saves every
// few steps (Group.Saves, Saved); the group's last member writes the
// final save. beforeFinish runs as a member's input has ended and
// afterFinish once it has left its group (last: it was the group's last
// member, to write the final save next): the test loses the group there.
func tallyKind(reg *nodes.Registry, n, every int, store *tallyStore, beforeFinish func(context.Context, int) error, afterFinish func(ctx context.Context, i int, last bool) error) {
	ports := func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
	}
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "tally", Ports: ports}, Sync: nodes.Always, Moves: true,
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				g := r.Group()
				defer g.Leave()
				if err := g.Saves(ctx); err != nil {
					return err
				}
				st := &tallyState{Counts: make([]int, n)}
				if err := g.Keep(ctx, st); err != nil {
					var re *nodes.Restore
					if !errors.As(err, &re) {
						return err
					}
					if re.Step >= 0 {
						store.mu.Lock()
						b := store.saves[re.Step]
						store.mu.Unlock()
						if b == nil {
							return fmt.Errorf("tally: no save of step %d to restore", re.Step)
						}
						if err := st.UnmarshalBinary(b); err != nil {
							return err
						}
					}
				}
				in := r.In("in")
				for {
					item, err := in.Recv(ctx)
					if err == io.EOF {
						break
					}
					if err != nil {
						return err
					}
					v := make([]float32, n)
					v[item.(*items.Blob).Seq] = 1
					if _, err := g.AllReduceSum(ctx, v); err != nil {
						return err
					}
					for i, x := range v {
						st.Counts[i] += int(x)
					}
					st.Step++
					if r.Index() == 0 && st.Step%every == 0 {
						store.save(ctx, st.Step, st, false)
						if err := g.Saved(ctx, st.Step); err != nil {
							return err
						}
					}
				}
				if err := beforeFinish(ctx, r.Index()); err != nil {
					return err
				}
				last, err := g.Finish(ctx)
				if err != nil {
					return err
				}
				if err := afterFinish(ctx, r.Index(), last); err != nil {
					return err
				}
				if last {
					store.save(ctx, st.Step, st, true)
				}
				return nil
			}), nil
		}})
}

// TestLostWholeAsMemberFinished: a saving group lost whole right after one
// of its members finished (its input ended and it left the group), the
// others not yet: across workers (a member on each of two workers, both
// killed), summing on one (killed), and the finished member on a worker
// that lives (the others' killed; its share is counted lost, for it to
// restart); and across workers one after the other: the finished member's
// worker first, its restart waiting for the final save on a live worker
// beside the restart of a member due the group's state, then the last
// member present's (the restarts' share, evicted for the finished one, is
// refused by the host at once: counted lost at once too, what it says
// then does not fail the run). The finished member's inputs were not settled at its return,
// so the group restores its last save, that member too, and trains again
// on what came after: the run ends ok, and the final save holds every
// item exactly once.
func TestLostWholeAsMemberFinished(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pin    []string // the tally's replicas
		killed []string
		first  int // the member that finishes first (-1: any)
		// apart: the first worker killed, then the others once the
		// finished member's restart has asked the host
		apart bool
		// evicted: the live worker whose share is counted lost for the
		// restore, said so as it restarts
		evicted string
	}{
		{name: "across workers", pin: []string{"w2", "w3"}, killed: []string{"w2", "w3"}, first: -1},
		{name: "on one", pin: []string{"w2"}, killed: []string{"w2"}, first: -1},
		{name: "finished on a live worker", pin: []string{"w1", "w2", "w2"}, killed: []string{"w2"}, first: 0, evicted: "w1"},
		{name: "one after the other", pin: []string{"w2", "w3"}, killed: []string{"w2", "w3"}, first: 0, apart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n, every = 30, 3
			store := &tallyStore{saves: map[int][]byte{}}
			var first atomic.Int32 // the member that finishes first (-1: none yet)
			first.Store(int32(tc.first))
			left, killed := make(chan struct{}), make(chan struct{})
			var leave sync.Once
			reg := nodes.Default.Clone()
			tallyKind(reg, n, every, store, func(ctx context.Context, i int) error {
				select {
				case <-killed: // a restart: on
					return nil
				default:
				}
				first.CompareAndSwap(-1, int32(i))
				if i == int(first.Load()) {
					// The first to finish goes on, and so does its restart
					// until a copy of it has left its group: on a loaded
					// machine its worker can be counted lost before it
					// leaves (no word for a lease), and its restart is
					// then the one to leave.
					select {
					case <-left:
					default:
						return nil
					}
				}
				// the others are killed with their worker, present, or
				// their share is over
				select {
				case <-killed:
				case <-ctx.Done():
				}
				return ctx.Err()
			}, func(ctx context.Context, _ int, _ bool) error {
				select {
				case <-killed:
				case <-left:
				default:
					leave.Do(func() { close(left) }) // the first has left its group
					select {
					case <-killed:
					case <-ctx.Done():
					}
				}
				return nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			c, kill, log := tallyRun(ctx, t, reg, n, tc.pin, "round_robin")
			go func() {
				select {
				case <-left:
				case <-ctx.Done():
					return
				}
				for k, w := range tc.killed {
					if k == 1 && tc.apart {
						// the finished member 0 restarted and asked the host
						if !testutil.Within(30*time.Second, func() bool {
							c.mu.Lock()
							h := c.groups["tally"]
							c.mu.Unlock()
							share := h.ShareOf(0)
							return share != "" && share != "w2"
						}) {
							t.Errorf("member 0's restart never asked the host\n%s", log.String())
						}
					}
					kill[w]()
				}
				close(killed)
			}()
			rep, err := c.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("the run hung: %v\n%s", err, log.String())
			}
			if err != nil || rep.Status != report.OK {
				t.Fatalf("status %s: %v\ncoordinator:\n%s", rep.Status, err, log.String())
			}
			select {
			case <-killed:
			default:
				t.Fatalf("the run ended with no member finished before the others: nothing was lost\n%s", log.String())
			}
			if !strings.Contains(log.String(), `stage "tally" lost every member of its group: its restarts restore its last save`) {
				t.Errorf("the coordinator did not say the group restores its save:\n%s", log.String())
			}
			if w := tc.evicted; w != "" {
				said := fmt.Sprintf(`dflow: the share %s on worker %s, counted lost for stage "tally"'s restore of its last save (the worker lives): restarting tally[0] on`, w, w)
				if out := log.String(); !strings.Contains(out, said) || strings.Contains(out, "worker "+w+" lost") {
					t.Errorf("the log does not say why the share %s restarts, or calls its worker lost:\n%s", w, out)
				}
			}
			checkFinal(t, store, log)
		})
	}
}

// checkFinal checks that the group's final save was written and holds
// every item exactly once.
func checkFinal(t *testing.T, store *tallyStore, log *syncLog) {
	t.Helper()
	store.mu.Lock()
	defer store.mu.Unlock()
	var final tallyState
	if err := final.UnmarshalBinary(store.final); err != nil {
		t.Fatalf("no final save (%d written): %v\n%s", store.finals, err, log.String())
	}
	for seq, k := range final.Counts {
		if k != 1 {
			t.Errorf("the final save trained item %d %d times, want once (all: %v)\n%s", seq, k, final.Counts, log.String())
			break
		}
	}
}

// tallyRun starts a server and three workers, w1 to w3 (kill closes a
// worker's connection and cancels it, as a killed process), and a
// coordinator for n items from a source on w3 to three tally replicas,
// pinned as pin says, over an edge of policy ("shared": one queue, every
// replica a consumer of it, as specs/dflash-torch.hcl feeds its ranks).
func tallyRun(ctx context.Context, t *testing.T, reg *nodes.Registry, n int, pin []string, policy string) (*Coordinator, map[string]func(), *syncLog) {
	t.Helper()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	kill := map[string]func(){}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i := range 3 {
		name := fmt.Sprintf("w%d", i+1)
		nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		kill[name] = func() { nc.Close(); cancel() }
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer nc.Close()
			RunWorker(ctx, WorkerOptions{Name: name, Conn: nc, Registry: reg, Load: loader(reg)})
		}()
	}
	src := fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count = %d
  }
}
stage "tally" {
  node     = "tally"
  replicas = 3
}
edge "e" {
  from     = src.out
  to       = tally.in
  policy   = %q
  capacity = 64
}
`, n, policy)
	job := wire.Job{Filename: "tally.hcl", Src: []byte(src)}
	g, err := loader(reg)(&job)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token, Name: "coordinator"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	log := &syncLog{}
	c, err := NewCoordinator(ctx, CoordOptions{Conn: nc, Graph: g, Job: job, Workers: 3, Registry: reg,
		Interval: 200 * time.Millisecond, Log: log,
		Pin:     map[string][]string{"src": {"w3"}, "tally": pin},
		Timings: wire.Timings{Lease: 3 * time.Second, AckWait: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return c, kill, log
}

// TestLastMemberLostBeforeFinalSave: the group's last save is at its
// last round (10 rounds each, a save every 5), its members 0 and 1 have
// finished and wait for the final save, and member 2 finishes last and
// its worker is lost before it writes the final save and returns. Its
// restart restores the last save, drops its items (the save holds them),
// is the group's last member at its Finish and writes the final save:
// the run ends ok, every item trained once. Before, no member restored,
// the restart kept its fresh state, was not the last at its Finish, and
// the others' wait for the final save was never answered: the run hung.
func TestLastMemberLostBeforeFinalSave(t *testing.T) {
	t.Parallel()
	const n, every = 30, 5
	store := &tallyStore{saves: map[int][]byte{}}
	othersLeft := make(chan struct{}) // members 0 and 1 have finished
	lastLeft, killed := make(chan struct{}), make(chan struct{})
	var finished atomic.Int32
	reg := nodes.Default.Clone()
	tallyKind(reg, n, every, store, func(ctx context.Context, i int) error {
		select {
		case <-killed: // member 2's restart: on
			return nil
		default:
		}
		if i != 2 {
			return nil
		}
		select { // the last to finish
		case <-othersLeft:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, func(ctx context.Context, i int, last bool) error {
		select {
		case <-killed:
			return nil
		default:
		}
		if i != 2 {
			if finished.Add(1) == 2 {
				close(othersLeft)
			}
			return nil
		}
		if !last {
			return fmt.Errorf("member 2 finished last and was not told it was the group's last")
		}
		close(lastLeft)
		<-ctx.Done() // killed with its worker before its final save
		return ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, kill, log := tallyRun(ctx, t, reg, n, []string{"w1", "w1", "w2"}, "round_robin")
	go func() {
		select {
		case <-lastLeft:
		case <-ctx.Done():
			return
		}
		kill["w2"]()
		close(killed)
	}()
	rep, err := c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the run hung: %v\n%s", err, log.String())
	}
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s: %v\ncoordinator:\n%s", rep.Status, err, log.String())
	}
	select {
	case <-killed:
	default:
		t.Fatalf("the run ended with member 2's worker alive: nothing was lost\n%s", log.String())
	}
	store.mu.Lock()
	saved := store.saves[n/3] != nil
	store.mu.Unlock()
	if !saved {
		t.Fatalf("no save at the last round, %d\n%s", n/3, log.String())
	}
	checkFinal(t, store, log)
	// Member 0 waited for the final save over member 2's lease at least:
	// idle, not busy.
	if r := rep.Stages["tally"].Replicas[0]; r.IdleSeconds < 2.5 || r.BusySeconds > r.IdleSeconds {
		t.Errorf("member 0, waiting for the final save: busy %.2fs, idle %.2fs; want the wait idle", r.BusySeconds, r.IdleSeconds)
	}
}

// syncLog is a log written by several goroutines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
