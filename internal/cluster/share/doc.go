// Package share is a worker's share of a run across hosts: RunWorker
// serves the jobs a coordinator sends (a worker's own share and the
// restarts of lost workers' replicas beside it), each in an engine of its
// own whose queues to other workers ride JetStream (links.For: a
// *jsQueue), whose chains stay in process (links.ChainFor), and whose
// inputs are settled by the share itself; no item goes through the
// coordinator. How the parts fit: ledger.go says it at length; the
// coordinator's side is package cluster, what both sides agree on package
// wire.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. What a replica sends has an id derived from the delivery it holds
//     (origin.hash, chainEdge.Derive), so a restart that sends it again
//     sends the same id, and the edge's stream drops it, whichever queue
//     it goes to. TestPlacedOnce.
//  2. An input is settled by one rule, for every item type: once its
//     replica has let it go and every publish of what was sent from it
//     has the server's answer, or, in a group that saves, once a save
//     holds it (taken.Done, taken.finish, taken.answered, tracked.keeps).
//     Nothing follows an item by its pointer. TestTakenSettledOnce,
//     TestLocalSaveNamesEveryMembersItem; in cmd/dflow TestAuditBytes and
//     TestAuditChain.
//  3. A share keeps what it took from redelivery only while it lives: it
//     renews its deliveries every AckWait/4 (jsQueue.touch), and once
//     counted lost it settles nothing more (links.released), so what it
//     held reaches the share that took over. TestSettleLost (package
//     cluster) and the kill tests of cmd/dflow.
//  4. Producers publish within their credit: the room read from the
//     stream and the grants their consumers say (jsQueue.waitRoom,
//     jsQueue.granted); the stream's own bound (wire.Backstop) is never
//     what stops them. TestRoomWithinBound, TestGrants, TestRoomSaid.
//  5. A producer waiting on a full queue costs the server nothing per
//     wait. TestFullQueueWaitIsQuiet.
//  6. A consumer's worker asks the server for no more than its inbox
//     holds (jsQueue.fetch). TestPullStatus, TestPulledMetadata.
//  7. A large item's bytes stay with its producer's share until its
//     consumer has acked it, and one that comes back after its holder's
//     loss is fetched again or held again (jsQueue.release,
//     jsQueue.refetch, jsQueue.rehold). TestLargeItemsIntact,
//     TestHolderGone.
//  8. A replica that returned is recorded settled only once all it took
//     is settled (links.recordSettled). TestSettledRecorded.
//  9. A queue ends for its consumers once every producer the graph wires
//     to it has its end key and the stream is empty; a restart's end
//     waits until the restart returns (jsQueue.ends).
//     TestEndWaitsForLocalRestart.
//  10. A chain's figures are recorded before its heads are acked, each
//     record by compare and set on the last; once the coordinator sealed
//     the record, the share acks nothing more (ledger.recordChains,
//     errSealed). TestChainRecordSealed.
//  11. A node's own clock passes through the share's wrappers
//     (clocked). TestOwnClockThroughShare.
//  12. A share's background work is one group (links.bg): keep-alive and
//     renewals, settling, each queue's publish answerer and pulls,
//     fetches, releases, records and the watch of the coordinator's
//     lease; cancelling it (links.close) is the shutdown, and close waits
//     for it. TestMain fails the package if a goroutine outlives its
//     test.
package share
