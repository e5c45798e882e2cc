package wire

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultAnswer is Timings.Answer's default.
const DefaultAnswer = 30 * time.Second

// SetupRun creates a run's streams, consumers and bucket: a work-queue
// stream per edge with a remote queue, each remote queue a subject of it
// with a durable consumer of its own that the queue's consumer replicas'
// workers all pull from; the end-key bucket. A queue holds its capacity
// by its producers' credit alone (edge.Queue.waitRoom: the room read, and
// the consumers' grants): the streams and consumers have no bound of their
// own, so a publish is never refused for room (which would let a later
// one in flight pass it), and a consumer may hold as many messages
// unacked as its stage keeps until settled (a group's until its save,
// checkpoint_every steps, say).
func SetupRun(ctx context.Context, js jetstream.JetStream, run string, g *graph.Graph, remote map[string][]bool, ackWait time.Duration) error {
	for ei, e := range g.Edges {
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
			Duplicates: 2 * time.Minute,
		})
		if err != nil {
			return fmt.Errorf("edge %q: stream: %w", e.Name, err)
		}
		for _, qi := range queues {
			if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
				Durable: ConsumerQueue(qi), FilterSubject: SubjQueue(run, ei, qi),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
				MaxAckPending: -1, MaxWaiting: 512,
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
