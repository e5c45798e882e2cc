package share

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
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go/jetstream"
)

// The ranks of a group stage across workers.
//
// A node that starts a group's replicas as distributed ranks (a plugin's
// group kind: torchrun's environment for each) needs to know where rank 0
// listens as the others reach it. On a cluster the members may sit on
// several workers: the share that runs rank 0 picks a port free on its
// host, on every interface, and records its host's address (the one its
// data plane gives the other workers) with the port under a key of the
// attempt (keyRank0: the stage and the instance that runs rank 0, so a
// group started again elsewhere gets a fresh one); the other members'
// shares read it. A member's local rank counts the members its share
// runs.

// rankWait bounds how long a member waits for rank 0's share to say where
// it listens.
const rankWait = time.Minute

// ranked gives the node of a stage whose replicas step together the
// places of their ranks across the workers (nodes.WithRankPlacer).
func (l *links) ranked(s *graph.Stage, n nodes.Node) nodes.Node {
	if l.syncs == nil || !l.syncs(s) {
		return n
	}
	place := func(ctx context.Context, r nodes.Replica) (nodes.RankPlace, error) { return l.rankPlace(ctx, s, r) }
	run := nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		return n.Run(nodes.WithRankPlacer(ctx, place), r)
	})
	if q, ok := n.(nodes.Quiescer); ok {
		return quiescent{run, q}
	}
	return run
}

// rankPlace is where replica r of group stage s runs as its rank sees it.
func (l *links) rankPlace(ctx context.Context, s *graph.Stage, r nodes.Replica) (nodes.RankPlace, error) {
	place := l.job.Place[s.Name]
	var p nodes.RankPlace
	if l.whole != nil && l.whole(s) && wire.Spread(place) {
		// a peer's worker lost, the coordinator counts it so within its
		// lease, and then stops this share too (a group on one worker is
		// lost with it, and a rank's failure there is a failure)
		p.PeerLoss = 2*l.job.Timings.Lease + l.job.Timings.AckWait
	}
	for i, in := range place {
		if in == l.instance {
			if i == r.Index() {
				p.LocalRank = p.LocalWorldSize
			}
			p.LocalWorldSize++
			p.LocalDevices = append(p.LocalDevices, s.Device(i))
		}
	}
	key := keyRank0(s, l.job.Attempt[s.Name], place[0])
	if place[0] == l.instance {
		l.pmu.Lock()
		if l.rank0s == nil {
			l.rank0s = map[string]*rank0{}
		}
		r0 := l.rank0s[key]
		if r0 == nil {
			r0 = &rank0{}
			l.rank0s[key] = r0
		}
		l.pmu.Unlock()
		r0.once.Do(func() { r0.addr, r0.port, r0.err = l.listen(ctx, key) })
		p.MasterAddr, p.MasterPort = r0.addr, r0.port
		return p, r0.err
	}
	ctx, cancel := context.WithTimeout(ctx, rankWait)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		e, err := l.ends.Get(ctx, key)
		if err == nil {
			host, port, err := net.SplitHostPort(string(e.Value()))
			if p.MasterPort, _ = strconv.Atoi(port); err != nil || p.MasterPort == 0 {
				return p, fmt.Errorf("stage %q: rank 0's address %q: %v", s.Name, e.Value(), err)
			}
			p.MasterAddr = host
			return p, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) && ctx.Err() == nil {
			return p, fmt.Errorf("stage %q replica %d: reading where rank 0 listens: %w", s.Name, r.Index(), err)
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("stage %q replica %d: rank 0 (on %s) did not say where it listens within %v", s.Name, r.Index(), place[0], rankWait)
		case <-time.After(wait):
		}
	}
}

// rank0 is where rank 0 of a group stage listens, picked once by the
// share that runs it (links.listen).
type rank0 struct {
	once sync.Once
	addr string
	port int
	err  error
}

// listen picks rank 0's port, free on every interface of this host, and
// records under key where it listens: this host's address as the other
// workers reach it (the first its data plane gives them).
func (l *links) listen(ctx context.Context, key string) (addr string, port int, err error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return "", 0, fmt.Errorf("a port for the group's rank 0 (MASTER_PORT): %w", err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	first, _, _ := strings.Cut(l.dp.Addr(), ",")
	if addr, _, err = net.SplitHostPort(first); err != nil {
		return "", 0, fmt.Errorf("rank 0's address (the data plane's %q): %w", l.dp.Addr(), err)
	}
	if _, err := l.ends.Put(ctx, key, []byte(net.JoinHostPort(addr, strconv.Itoa(port)))); err != nil {
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
