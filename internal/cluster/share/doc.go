// Package share is a worker's share of a run across hosts: RunWorker
// serves the jobs a coordinator sends (a worker's own share and the
// restarts of lost workers' replicas beside it), each in an engine of its
// own whose queues to other workers ride JetStream (links.For: an
// edge.Queue), whose chains stay in process (links.ChainFor), and whose
// inputs are settled by the share itself; no item goes through the
// coordinator. How the parts fit: ledger.go says it at length; the queue
// on JetStream is package edge, the coordinator's side package cluster,
// what both sides agree on package wire.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. What a replica sends in a chain has an id derived from the delivery
//     it holds (chainEdge.Derive, edge.DerivedID), as on a queue on
//     JetStream (package edge, rule 1). TestPlacedOnce.
//  2. An input is settled by one rule, for every item type: once its
//     replica has let it go and every publish of what was sent from it
//     has the server's answer, or, in a group that saves, once a save
//     holds it (taken.Done, taken.finish, taken.answered, tracked.keeps).
//     Nothing follows an item by its pointer. TestTakenSettledOnce,
//     TestLocalSaveNamesEveryMembersItem; in cmd/dflow TestAuditBytes and
//     TestAuditChain.
//  3. Once counted lost, a share settles nothing more (links.released,
//     ledger.settle), so what it held reaches the share that took over.
//     TestSettleLost (package figures) and the kill tests of cmd/dflow.
//  4. A replica that returned is recorded settled only once all it took
//     is settled (links.recordSettled). TestSettledRecorded.
//  5. A chain's figures are recorded before its heads are acked, each
//     record by compare and set on the last; once the coordinator sealed
//     the record, the share acks nothing more (ledger.recordChains,
//     errSealed). TestChainRecordSealed.
//  6. A node's own clock passes through the share's wrappers
//     (clocked). TestOwnClockThroughShare.
//  7. A share's background work is one group (links.bg): keep-alive and
//     renewals, settling, each queue's publish answerer and pulls
//     (edge.Env.Go), fetches, releases, records and the watch of the
//     coordinator's lease; cancelling it (links.close) is the shutdown,
//     and close waits for it. TestMain fails the package if a goroutine
//     outlives its test.
package share
