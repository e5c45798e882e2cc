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
//     worker rides a JetStream work-queue stream (package edge): shared
//     is one stream and one durable consumer that every consumer
//     replica's worker pulls from; round_robin and key_hash keep the
//     engine's wiring, one stream per queue. Producers publish within
//     the edge's capacity (their credit: the room read from the stream
//     and the grants their consumers say); an item's bytes past 256 KiB
//     stay with its producer's share, fetched over HTTP by the consumer's
//     worker and released once acked (package dataplane); every message
//     carries an id (Nats-Msg-Id: JetStream drops a republished
//     duplicate);
//   - termination: the engine closes a queue's transport when the last
//     local producer is done; the transport writes an end key per local
//     producer replica into the run's key-value bucket, and a queue's Recv
//     ends once every producer the graph wires to it has its key and the
//     stream is empty (every item acked), wherever they ran;
//   - a stage's replica group whose members sit on several workers is
//     hosted by the coordinator (package group/host; the members' side
//     is package group): members' collectives are requests that the
//     coordinator answers when every member still present has arrived; a
//     member's leave is a request too (the uneven-ends rule).
//
// Control (package wire names the subjects): workers announce
// themselves every 250ms on dflow.hello.NAME; the coordinator sends a job
// to dflow.w.NAME.run, heartbeats on dflow.r.RUN.hb (a worker aborts its
// share when that stops), asks for snapshots on dflow.r.RUN.snap.INSTANCE
// and gets each share's report on dflow.r.RUN.done. docs/cluster.md is
// the user's side, docs/design/cluster.md how it stays exact.
//
// How the packages fit. This package is what the rest of dflow uses (the
// Coordinator, and through aliases RunWorker, StartServer, Connect, their
// options, Roots) and holds the coordinator: membership and leases, and
// the restarts of lost shares as package restarts decides them
// (membership.go), the gathering of the shares' snapshots and reports
// (gather.go). Beside it, each with a doc.go listing its invariants, the
// function that keeps each and the test that fails without it:
//
//   - internal/cluster/figures: the run's figures merged from the
//     shares' and the streams', and their books, over a view of what the
//     coordinator knows (figures.Run);
//   - internal/cluster/deadlock: the deadlock watch across workers, over
//     a view of what the coordinator knows at each look;
//   - internal/cluster/finished: which replicas of a lost share had
//     finished and stay, and the ends the coordinator writes for them;
//   - internal/cluster/restarts: what a lost share's replicas become
//     (stay, restart where, fail the run) and what the loss does to their
//     groups, over a view of what the coordinator knows (restarts.View);
//   - internal/cluster/moves: a rebalance's record across hosts, where its
//     spare slots go, which replica each move takes and which slot it
//     starts, and which stages' slots are let go;
//   - internal/cluster/share: a worker's share of a run: its queues'
//     links, control, the engine's run and its report;
//   - internal/cluster/follow: what a share follows of its restartable
//     replicas (the delivery each holds, what it keeps for its group's
//     save, its settled record), local groups' saves, resuming sources;
//   - internal/cluster/edge: a queue on JetStream as a share sees it
//     (room, grants, publishes, pulls, ends, large items' bytes);
//   - internal/cluster/settle: the receipts of what a share takes and the
//     ledger that settles them;
//   - internal/cluster/wire: what the coordinator and the shares agree on
//     (the job, subjects, streams and buckets, records, rules on kinds);
//   - internal/cluster/dataplane: a share's store of large items' bytes
//     and its HTTP server;
//   - internal/cluster/group: a replica group across workers as its
//     members see it: the wire and a share's Member;
//   - internal/cluster/group/host: the coordinator's Host of each group
//     stage: rounds and sums, leaves, losses, the state handed to
//     restarts and slots, a restore;
//   - internal/cluster/ranks: where the ranks of a group across workers
//     meet their rank 0;
//   - internal/cluster/control: placement, a worker's roots, the lease a
//     waiting side judges;
//   - internal/cluster/broker: the NATS server, connections to it, and
//     JetStream's pull protocol as a queue speaks it.
//
// The coordinator's invariants, each with the function that keeps it and
// a test that fails without it:
//
//  1. A lost worker's share is told it is over, and its replicas go as
//     package restarts decides (which stay, which restart, what their
//     groups restore): the ends of those recorded finished (package
//     finished) written, the others restarted on a live worker (never
//     one counted gone), passing over one that does not answer; the
//     shares a group's restore evicts are counted lost, and restarted at
//     the next check. recover, endedOn, checkLive;
//     TestSettledAfterLastSnapshot, TestRestartPassesOverGoneWorker,
//     TestLostWholeAsMemberFinished, and in package finished
//     TestFinishedReplicaStays and TestFinishedChainStaysWhole.
//  2. A lost share's chain record is sealed before its replicas restart,
//     so a share that was only slow acks nothing more. sealChain (by
//     wire.SealChain); TestChainRecordSealed (package settle).
//  3. A run that completed or drained is counted by its streams and its
//     chain records, read once every share is done, and ends with the
//     report figures.Report gives, its books checked: one that does not
//     balance fails, it never ends ok. A run cut short is counted by what
//     its engines saw. merged; TestBooks (package figures), and in
//     cmd/dflow TestAuditChain.
//  4. A run whose shares have all ended while a remote queue's stream
//     still holds items fails: a consumer must read its input to the
//     end. Run, unread (figures.Streams.Unread);
//     TestLargeItemsNobodyReads.
//  5. A deadlock across workers is judged (package deadlock) on every
//     replica's latest figures from the share that runs it, or ran it,
//     and on the groups the coordinator hosts, and only while the run
//     has neither failed nor been aborted; a drain that cannot complete
//     ends aborted. runLoop.judge, deadlockView;
//     TestDeadlockAcrossWorkers, TestDeadlockStopsDrainAcrossWorkers.
//  6. The coordinator's heartbeat, subscriptions and watches end with its
//     Run. TestMain fails the package if a goroutine outlives its test.
//  7. A rebalance's moves are made as package moves places them, each
//     recorded only once its share took it; a share taking over a lost
//     worker runs the slots a move had started and not the replicas a
//     move took away (a group member a move took away, lost, leaves its
//     group: package restarts). move, release (moves.go), startInstance
//     (coordinator.go); in cmd/dflow TestRebalanceAcrossHosts,
//     TestRebalanceWorkerLost, TestRebalanceGroupsAcrossHosts and
//     TestRebalanceGroupWorkerLost.
package cluster
