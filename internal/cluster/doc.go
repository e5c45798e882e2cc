// Package cluster runs a pipeline across hosts on NATS JetStream: workers
// (one per host, `dflow worker --join URL`) each run their share of a
// graph's replicas in an engine of their own (engine.Options.Here), and a
// coordinator (`dflow run SPEC --cluster URL`) places the replicas, starts
// the workers, gathers their snapshots and reports, and merges them into
// one snapshot and one report, as a local run prints them.
//
// What crosses hosts:
//
//   - an edge's queue whose producers and consumers do not all sit in one
//     worker rides a JetStream work-queue stream (transport.go): shared is
//     one stream and one durable consumer that every consumer replica's
//     worker pulls from; round_robin and key_hash keep the engine's wiring,
//     one stream per queue. The stream holds at most the edge's capacity
//     (MaxMsgs, DiscardNew: a producer's Send waits for room), an item's
//     bytes past 256 KiB stay with its producer's share, fetched over HTTP
//     by the consumer's worker and released once acked (dataplane.go), and
//     every message carries an id (Nats-Msg-Id: JetStream drops a
//     republished duplicate);
//   - termination: the engine closes a queue's transport when the last
//     local producer is done; the transport writes an end key per local
//     producer replica into the run's key-value bucket, and a queue's Recv
//     ends once every producer the graph wires to it has its key and the
//     stream is empty (every item acked), wherever they ran;
//   - a stage's replica group whose members sit on several workers is
//     hosted by the coordinator (group.go): members' collectives are
//     requests that the coordinator answers when every member still present
//     has arrived; a member's leave is a request too (the uneven-ends rule).
//
// Control (proto.go): workers announce themselves every 250ms on
// dflow.hello.NAME; the coordinator sends a job to dflow.w.NAME.run,
// heartbeats on dflow.r.RUN.hb (a worker aborts its share when that stops),
// asks for snapshots on dflow.r.RUN.snap.INSTANCE and gets each share's
// report on dflow.r.RUN.done. docs/cluster.md is the user's side.
package cluster
