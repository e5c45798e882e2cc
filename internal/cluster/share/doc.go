// Package share is a worker's share of a run across hosts: RunWorker
// serves the jobs a coordinator sends (a worker's own share and the
// restarts of lost workers' replicas beside it), each in an engine of its
// own whose queues to other workers ride JetStream (links.For: an
// edge.Queue), whose chains stay in process (links.ChainFor), and whose
// restartable replicas it follows (package follow), their inputs settled
// by its ledger; no item goes through the coordinator. The queue on
// JetStream is package edge, settling (the receipts, the ledger, chains'
// figures and resuming sources' positions) package settle, where group
// stages' ranks meet rank 0 package ranks, the coordinator's side package
// cluster, what both sides agree on package wire; settle's ledger.go says
// at length how they make exactly once.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. Once counted lost, a share keeps nothing from redelivery and
//     settles nothing more (links.released, settle.Share.Released), so
//     what it held reaches the share that took over. TestSettleLost
//     (package figures) and the kill tests of cmd/dflow.
//  2. A share's goroutines are one group (links.bg): keep-alive and
//     renewals, the ledger's settling (settle.Ledger.Run), each queue's
//     publish answerer and pulls (edge.Env.Go), fetches, releases, the
//     records of the replicas it follows (links.Go, none once close has
//     begun), and in a worker's share the engine's run, a handler for
//     each control subject and the watch of the coordinator's lease
//     (shareRun.run, shareRun.handle). The run's context ends the engine;
//     the share's end waits for the engine's return, then flushes,
//     settles and reports with the rest of the group still serving it.
//     Cancelling the group (links.close, after control is unsubscribed)
//     is the shutdown, and close waits for every member. TestMain fails
//     the package if a goroutine outlives its tests, and so does package
//     cluster's, whose tests run workers in process.
package share
