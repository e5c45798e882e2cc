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
//     by the consumer's worker and released once acked (package
//     dataplane), and
//     every message carries an id (Nats-Msg-Id: JetStream drops a
//     republished duplicate);
//   - termination: the engine closes a queue's transport when the last
//     local producer is done; the transport writes an end key per local
//     producer replica into the run's key-value bucket, and a queue's Recv
//     ends once every producer the graph wires to it has its key and the
//     stream is empty (every item acked), wherever they ran;
//   - a stage's replica group whose members sit on several workers is
//     hosted by the coordinator (package group): members' collectives are
//     requests that the coordinator answers when every member still present
//     has arrived; a member's leave is a request too (the uneven-ends rule).
//
// Control (proto.go): workers announce themselves every 250ms on
// dflow.hello.NAME; the coordinator sends a job to dflow.w.NAME.run,
// heartbeats on dflow.r.RUN.hb (a worker aborts its share when that stops),
// asks for snapshots on dflow.r.RUN.snap.INSTANCE and gets each share's
// report on dflow.r.RUN.done. docs/cluster.md is the user's side.
//
// How the packages fit. This package is what the rest of dflow uses (the
// Coordinator, RunWorker, StartServer, Connect, their options, Roots), and
// it holds what shares one share's state (links) or the Coordinator's:
//
//   - the edge: a queue on JetStream, its room, grants and bound, its
//     pipelined publishes and its pulls (transport.go, publish.go,
//     pull.go), and settling, the receipts of what a restartable stage
//     takes and the rule that acks them (ledger.go, resume.go, saves.go,
//     held.go);
//   - chains (chain.go): an edge between restartable stages whose queues
//     each join one producer replica to one consumer on one worker stays
//     in process (engine.Chain), its items' receipts derived from their
//     senders', the input at a chain's head settled once what the chain
//     sent on is stored, and the chain's figures recorded before its
//     heads are acked;
//   - the Coordinator (coordinator.go, membership.go, deadlock.go,
//     figures.go, books.go) and the worker (worker.go).
//
// Beside it, each with a doc.go listing its invariants, the function that
// keeps each and the test that fails without it:
//
//   - internal/cluster/dataplane: a share's store of large items' bytes
//     and its HTTP server; the edge gives it narrow interfaces (the queue
//     a held item's message is on, the input it derives from);
//   - internal/cluster/group: the collectives of a replica group across
//     workers, the coordinator's Host and a share's Member, whose hooks
//     into the share are funcs;
//   - internal/cluster/control: placement, a worker's roots, the lease a
//     waiting side judges.
//
// A worker's share runs its background work (keep-alive, settling,
// publish answers, pulls, fetches, releases, records, the coordinator's
// lease watch) as one group, links.bg, whose cancellation (links.stopCtx,
// by links.close) is its shutdown; close waits for the group.
package cluster
