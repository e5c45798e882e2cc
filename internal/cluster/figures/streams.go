package figures

// What the run's streams and records say once every share is done.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream is what an edge's stream stored over the run, and stores still.
type Stream struct{ Stored, Left int64 }

// Streams is where the figures read a run's streams and records: its
// JetStream, its id, and which of its graph's queues ride a stream.
type Streams struct {
	JS     jetstream.JetStream
	Run    string
	Graph  *graph.Graph
	Remote map[string][]bool
}

// Unread fails a run whose shares have all ended while a remote queue's
// stream still holds items never delivered to any consumer: their
// consumers returned before reading their input to the end, as a local
// run fails (no one engine sees it: each worker's consumers ended with
// producers elsewhere), and so do items delivered to a worker and never
// acked: its consumers returned while a fetch was bringing them (a worker
// whose consumers returned with items in its inbox fails itself). Every
// share has flushed its acks before its report, so the server has read
// them; it applies them on its own time, which is waited for (2s). depth
// is each queue's count as read, by edge and queue index, up to the first
// that holds items (End.Depth: the run's last snapshot shows it).
func (st Streams) Unread(ctx context.Context) (depth map[[2]int]int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	depth = map[[2]int]int{}
	for ei, e := range st.Graph.Edges {
		for qi := range e.Queues {
			if !st.Remote[e.Name][qi] {
				continue
			}
			cons, err := st.JS.Consumer(ctx, wire.StreamEdge(st.Run, ei), wire.ConsumerQueue(qi))
			if err != nil {
				continue
			}
			left := 0
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				info, err := cons.Info(ctx)
				if err != nil {
					break
				}
				left = int(info.NumPending) + info.NumAckPending
				if left == 0 || info.NumPending > 0 || time.Now().After(deadline) {
					break
				}
			}
			depth[[2]int{ei, qi}] = left
			if left > 0 {
				return depth, fmt.Errorf("edge %q queue %d: stage %q returned with %d items of stage %q unread; a consumer must read its input to the end",
					e.Name, qi, e.To.Stage.Name, left, e.From.Stage.Name)
			}
		}
	}
	return depth, nil
}

// Totals reads the stream of every edge whose queues all ride one
// (nothing of theirs counted by an engine alone), by edge name: what
// every producer sent, duplicates dropped, and what is not yet consumed
// (End.Streams).
func (st Streams) Totals() map[string]Stream {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]Stream{}
	for ei, e := range st.Graph.Edges {
		if slices.Contains(st.Remote[e.Name], false) {
			continue
		}
		s, err := st.JS.Stream(ctx, wire.StreamEdge(st.Run, ei))
		if err != nil {
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			continue
		}
		out[e.Name] = Stream{Stored: int64(info.State.LastSeq), Left: int64(info.State.Msgs)}
	}
	return out
}

// Chains reads the chain record of each share named, for the figures of
// a run that completed (mergedEdge): a lost share's part of a chained
// edge is what it recorded settled, a live share counted apart what it
// did again of a lost one's resuming sources, and a stream's head settled
// by more than one share is taken off all but once (twice: End.Chains
// and End.Twice). A record that cannot be read is said on log, and that
// share's figures are its engine's.
func (st Streams) Chains(shares []string, log io.Writer) (recs map[string]wire.ChainRecord, twice map[string]int64) {
	recs = map[string]wire.ChainRecord{}
	for _, name := range shares {
		rec, err := st.readChain(name)
		if err != nil {
			fmt.Fprintf(log, "dflow: the chains' record of the share %s could not be read (%v): its figures are the engines'\n", name, err)
			continue
		}
		recs[name] = rec
	}
	return recs, wire.ChainTwice(recs)
}

// readChain reads the chain record of share inst (none: it recorded
// nothing, or the read failed).
func (st Streams) readChain(inst string) (wire.ChainRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := st.JS.KeyValue(ctx, wire.BucketEnds(st.Run))
	if err != nil {
		return wire.ChainRecord{}, err
	}
	return wire.ReadChain(ctx, kv, inst)
}
