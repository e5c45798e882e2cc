// Package edge is a queue of an edge on JetStream, as one worker's share
// sees it: its producers' side (room, credit and grants, publishes
// pipelined and answered in order, the ends they write) and its
// consumers' side (pulls into an inbox, deliveries held until settled,
// redeliveries dropped, large items' bytes fetched from their holder's
// data plane). What a queue asks of its share (failing it, the receipts
// of items for stages that restart, whether it was counted lost) is the
// Share interface; package share implements it, and package settle
// settles the receipts.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. What a restartable replica sends has an id derived from the
//     delivery it holds (Queue.Send, DerivedID), so a restart that sends
//     it again sends the same id, and the edge's stream drops it,
//     whichever queue it goes to; of 128 bits, two items' ids do not
//     meet. TestPlacedOnce (package share), TestDerivedID.
//  2. A publish derived from a delivery is told to it as it goes and as
//     its answer comes (Receipt: Derived, Answered), so the share settles
//     the delivery only once all it sent is stored. TestTakenSettledOnce
//     (package settle); in cmd/dflow TestAuditBytes.
//  3. A share keeps what it took from redelivery only while it lives: it
//     renews its deliveries every AckWait/4 (Queue.Touch), and once
//     counted lost (Share.Released) renews nothing, so what it held
//     reaches the share that took over. TestSettleLost (package figures)
//     and the kill tests of cmd/dflow.
//  4. Producers publish within their credit: the room read (the capacity
//     less what the consumer has yet to be delivered and their publishes
//     under way) and the grants their consumers say (Queue.waitRoom,
//     Queue.granted). By the room read alone, what waits undelivered
//     never passes the capacity, whatever the consumers hold unacked; a
//     read that crosses a grant under way, or shares that read the same
//     room at once, may each add up to their part of it until a read
//     finds the queue full (publish.go, "The capacity").
//     TestQueueHoldsItsCapacity, TestGrants, TestRoomSaid (package
//     share).
//  5. A producer waiting on a full queue costs the server nothing per
//     wait. TestFullQueueWaitIsQuiet.
//  6. A consumer's worker asks the server for no more than its inbox
//     holds (Queue.fetch), and reads what each request brought, or says
//     will not come (package broker's PullStatus, Pulled).
//     TestPullStatus, TestPulledMetadata (package broker).
//  7. A large item's bytes stay with its producer's share until its
//     consumer has acked it, and one that comes back after its holder's
//     loss is fetched again or held again (Queue.Release, Queue.refetch,
//     Queue.rehold). TestLargeItemsIntact, TestHolderGone.
//  8. A queue ends for its consumers once every producer the graph wires
//     to it has its end key and the stream is empty; a restart's end
//     waits until the restart returns (Queue.ends).
//     TestEndWaitsForLocalRestart.
//  9. Every goroutine of a queue runs in its share's background group
//     (Env.Go) and ends once the group's Stop is done. TestMain of
//     package share fails if a goroutine outlives its test.
//
// The tests named in package share drive queues through a share's links,
// as a worker does.
package edge
