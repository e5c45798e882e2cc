package ranks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/netport"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go/jetstream"
)

// Placer is one share's side of the ranks of its group stages.
type Placer struct {
	Job      *wire.Job
	Instance string             // the share's name
	Ends     jetstream.KeyValue // the run's end bucket: where rank 0 listens
	// Addr is the share's data plane's address as other workers reach it
	// (dataplane.Plane.Addr: the first of a list): rank 0's host
	Addr func() string
	// Whole says whether a stage's group restarts whole after a member's
	// loss (Spec.Whole): its ranks wait for that (nil: none does)
	Whole func(*graph.Stage) bool

	mu sync.Mutex
	// rank0s are where the group stages' ranks 0 this share runs listen,
	// by keyRank0
	rank0s map[string]*rank0
}

// rankWait bounds how long a member waits for rank 0's share to say where
// it listens.
const rankWait = time.Minute

// Place is where replica i of group stage s runs as its rank sees it:
// rank 0's address and port (picked by the share that runs it, read by
// the others), the replica's local rank among those of its share, and how
// long a rank waits for a lost peer's restart.
func (pl *Placer) Place(ctx context.Context, s *graph.Stage, i int) (nodes.RankPlace, error) {
	place := pl.Job.Place[s.Name]
	var p nodes.RankPlace
	if pl.Whole != nil && pl.Whole(s) && wire.Spread(place) {
		// a peer's worker lost, the coordinator counts it so within its
		// lease, and then stops this share too (a group on one worker is
		// lost with it, and a rank's failure there is a failure)
		p.PeerLoss = 2*pl.Job.Timings.Lease + pl.Job.Timings.AckWait
	}
	for j, in := range place {
		if in == pl.Instance {
			if j == i {
				p.LocalRank = p.LocalWorldSize
			}
			p.LocalWorldSize++
			p.LocalDevices = append(p.LocalDevices, s.Device(j))
		}
	}
	key := keyRank0(s, pl.Job.Attempt[s.Name], place[0])
	if place[0] == pl.Instance {
		pl.mu.Lock()
		if pl.rank0s == nil {
			pl.rank0s = map[string]*rank0{}
		}
		r0 := pl.rank0s[key]
		if r0 == nil {
			r0 = &rank0{}
			pl.rank0s[key] = r0
		}
		pl.mu.Unlock()
		r0.once.Do(func() { r0.addr, r0.port, r0.err = pl.listen(ctx, key) })
		p.MasterAddr, p.MasterPort = r0.addr, r0.port
		return p, r0.err
	}
	ctx, cancel := context.WithTimeout(ctx, rankWait)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		e, err := pl.Ends.Get(ctx, key)
		if err == nil {
			host, port, err := net.SplitHostPort(string(e.Value()))
			if p.MasterPort, _ = strconv.Atoi(port); err != nil || p.MasterPort == 0 {
				return p, fmt.Errorf("stage %q: rank 0's address %q: %v", s.Name, e.Value(), err)
			}
			p.MasterAddr = host
			return p, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) && ctx.Err() == nil {
			return p, fmt.Errorf("stage %q replica %d: reading where rank 0 listens: %w", s.Name, i, err)
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("stage %q replica %d: rank 0 (on %s) did not say where it listens within %v", s.Name, i, place[0], rankWait)
		case <-time.After(wait):
		}
	}
}

// rank0 is where rank 0 of a group stage listens, picked once by the
// share that runs it (Placer.listen).
type rank0 struct {
	once sync.Once
	addr string
	port int
	err  error
}

// listen picks rank 0's port, free on every interface of this host, and
// records under key where it listens: this host's address as the other
// workers reach it (the first its data plane gives them).
func (pl *Placer) listen(ctx context.Context, key string) (addr string, port int, err error) {
	if port, err = netport.Free(""); err != nil {
		return "", 0, fmt.Errorf("a port for the group's rank 0 (MASTER_PORT): %w", err)
	}
	first, _, _ := strings.Cut(pl.Addr(), ",")
	if addr, _, err = net.SplitHostPort(first); err != nil {
		return "", 0, fmt.Errorf("rank 0's address (the data plane's %q): %w", pl.Addr(), err)
	}
	if _, err := pl.Ends.Put(ctx, key, []byte(net.JoinHostPort(addr, strconv.Itoa(port)))); err != nil {
		return "", 0, fmt.Errorf("recording where rank 0 listens: %w", err)
	}
	return addr, port, nil
}

// keyRank0 is where the share that runs rank 0 of group stage s (the
// instance inst) records where it listens, in the group's attempt
// (Job.Attempt).
func keyRank0(s *graph.Stage, attempt int, inst string) string {
	if attempt > 0 {
		// a group lost whole and started again: a member sent its job
		// before rank 0's share was placed meets it all the same
		return "rank0." + wire.Token(s.Name) + ".a" + strconv.Itoa(attempt)
	}
	return "rank0." + wire.Token(s.Name) + "." + wire.Token(inst)
}
