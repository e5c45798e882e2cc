package wire

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultAnswer is Timings.Answer's default.
const DefaultAnswer = 30 * time.Second

// SetupRun creates a run's streams, consumers and bucket: a work-queue
// stream per edge with a remote queue, each remote queue a subject of it
// with a durable consumer of its own that the queue's consumer replicas'
// workers all pull from; the end-key bucket. A queue holds its capacity:
// producers publish within their credit (edge.Queue.waitRoom: the room read,
// and the consumers' grants), and the stream's bound per subject, past
// what that allows, is only a backstop.
//
// A stage whose inputs may wait for a save (holds: HeldBack) keeps them
// unacked until then, checkpoint_every steps, say: its edges' stream and
// consumers have no bound to speak of; the room still paces producers.
func SetupRun(ctx context.Context, js jetstream.JetStream, run string, g *graph.Graph, remote map[string][]bool, chained map[string]bool, ackWait time.Duration, holds func(*graph.Stage) bool) error {
	for ei, e := range g.Edges {
		bound := Backstop(e, chained)
		if holds != nil && holds(e.To.Stage) {
			bound = 1 << 30 // none to speak of
		}
		var subjects []string
		var queues []int
		for qi := range e.Queues {
			if remote[e.Name][qi] {
				subjects = append(subjects, SubjQueue(run, ei, qi))
				queues = append(queues, qi)
			}
		}
		if len(queues) == 0 {
			continue
		}
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: StreamEdge(run, ei), Subjects: subjects,
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage,
			MaxMsgsPerSubject: int64(bound), Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
			Duplicates: 2 * time.Minute,
		})
		if err != nil {
			return fmt.Errorf("edge %q: stream: %w", e.Name, err)
		}
		for _, qi := range queues {
			if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
				Durable: ConsumerQueue(qi), FilterSubject: SubjQueue(run, ei, qi),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
				MaxAckPending: bound, MaxWaiting: 512,
			}); err != nil {
				return fmt.Errorf("edge %q queue %d: consumer: %w", e.Name, qi, err)
			}
		}
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketEnds(run), Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("end bucket: %w", err)
	}
	// where a large item sent again after a loss is held now (rehold), for
	// as long as a duplicate can be dropped
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketHolders(run), Storage: jetstream.MemoryStorage, TTL: 2 * time.Minute}); err != nil {
		return fmt.Errorf("holder bucket: %w", err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketPositions(run), Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("position bucket: %w", err)
	}
	return nil
}

// Backstop is the most messages a queue of e's stream may store (and
// have delivered unacked): its capacity for each producer replica and
// once more, and what its consumers' workers may hold besides. Producers
// keep what is not yet delivered within the capacity by their credit
// (edge.Queue.waitRoom); two producers that read the same room at once
// may store up to their part of the capacity each, a share counted lost may still have
// some publishes under way, and what the consumers' workers have taken
// and not yet acked is out of the room: fetched ahead (two fetches each),
// in their replicas' hands, or done with and waiting until what it sent
// downstream is settled (up to the downstream edges' capacities, and as
// much again in their consumers' hands; through a chain, chained, the
// edges after it too, for the input at its head is settled only once
// what the chain sent on is). So the stream's own bound is past what
// pacing allows: a publish is never refused for room, which would let a
// later one in flight pass it.
func Backstop(e *graph.Edge, chained map[string]bool) int {
	n := 1
	for _, q := range e.Queues {
		n = max(n, len(q.Producers))
	}
	capacity := max(e.Capacity, 1)
	held := capacity + 4*e.To.Stage.Replicas
	var downstream func(s *graph.Stage)
	downstream = func(s *graph.Stage) {
		for _, out := range s.Outputs {
			for _, d := range out.Edges {
				held += 2 * max(d.Capacity, 1) * len(d.Queues)
				if chained[d.Name] {
					downstream(d.To.Stage)
				}
			}
		}
	}
	downstream(e.To.Stage)
	// Producers take the consumers' grants as room as soon as messages
	// are fetched (edge.Queue.granted), and the server applies acks on its
	// own time, behind deliveries and publishes: acked messages it still
	// stores, up to a capacity more and a fixed margin.
	late := capacity + lateAcks
	return capacity*(n+1) + held + late
}

// lateAcks is the margin of Backstop for acks the server has yet to
// apply, beside a capacity's worth.
const lateAcks = 64

// HeldBack says which stages' inputs may stay unacked until a save
// downstream: a stage whose kind moves (its group may save, and settles
// what it trained on only once a save holds it), and every stage that
// feeds one, however far up: the producer of a large item settles its
// input once its consumer has released the bytes.
func HeldBack(reg *nodes.Registry, g *graph.Graph) func(*graph.Stage) bool {
	held := map[*graph.Stage]bool{}
	var mark func(s *graph.Stage)
	mark = func(s *graph.Stage) {
		if held[s] {
			return
		}
		held[s] = true
		for _, e := range g.Edges {
			if e.To.Stage == s {
				mark(e.From.Stage)
			}
		}
	}
	for _, s := range g.Stages {
		if Moves(reg, s) {
			mark(s)
		}
	}
	return func(s *graph.Stage) bool { return held[s] }
}

// TeardownRun deletes what SetupRun made.
func TeardownRun(js jetstream.JetStream, run string, g *graph.Graph, remote map[string][]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for ei, e := range g.Edges {
		if slices.Contains(remote[e.Name], true) {
			js.DeleteStream(ctx, StreamEdge(run, ei))
		}
	}
	js.DeleteKeyValue(ctx, BucketEnds(run))
	js.DeleteKeyValue(ctx, BucketHolders(run))
	js.DeleteKeyValue(ctx, BucketPositions(run))
}

// QueueMsgs is how many messages queue qi of edge ei stores, delivered
// or not: the stream's count of the queue's subject.
func QueueMsgs(ctx context.Context, js jetstream.JetStream, run string, ei, qi int) (int, error) {
	s, err := js.Stream(ctx, StreamEdge(run, ei))
	if err != nil {
		return 0, err
	}
	return SubjectMsgs(ctx, s, SubjQueue(run, ei, qi))
}

// QueueWaiting is how many of queue qi's messages count against its room
// (edge.Queue.waitRoom): stored, less what is delivered to a consumer's
// worker and not yet acked.
func QueueWaiting(ctx context.Context, js jetstream.JetStream, run string, ei, qi int) (int, error) {
	n, err := QueueMsgs(ctx, js, run, ei, qi)
	if err != nil {
		return 0, err
	}
	c, err := js.Consumer(ctx, StreamEdge(run, ei), ConsumerQueue(qi))
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return max(n-info.NumAckPending, 0), nil
}

// SubjectMsgs is how many messages stream s stores on subject subj.
func SubjectMsgs(ctx context.Context, s jetstream.Stream, subj string) (int, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0, err
	}
	return int(info.State.Subjects[subj]), nil
}

// NewJS is a connection's JetStream, its pipelined publishes answered or
// failed within DefaultAnswer.
func NewJS(nc *nats.Conn) (jetstream.JetStream, error) {
	return jetstream.New(nc, jetstream.WithPublishAsyncTimeout(DefaultAnswer), jetstream.WithPublishAsyncMaxPending(1<<16))
}
