// Package finished says which replicas of a share counted lost had
// finished there, and stay finished rather than restart: what its worker
// recorded in the run's end bucket (each replica's settled key, the end
// keys of the queues it feeds) against what the share's last snapshot
// said. The coordinator asks as it recovers a lost share (Replicas), and
// writes the ends of those that stay (WriteEnds) and marks them done in
// that snapshot (MarkDone).
//
// It reads what the coordinator knows through a Lost, which the
// coordinator builds under its own lock, and the bucket through a
// jetstream.KeyValue; it keeps nothing of either.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. A lost share's replica of a restartable stage stays finished only
//     where that share itself recorded it settled (nothing of it can
//     come back to a restart), and either its last snapshot had it done
//     or the end of every queue it feeds is written (its consumers may
//     have ended on them); what cannot be read is not finished.
//     Replicas; TestFinishedReplicaStays.
//  2. Not one that feeds a queue in process on the lost worker (its
//     consumer is gone with it), and, where its stage has no group across
//     workers, none of the stage's replicas there unless all of them had
//     finished. Replicas; TestFinishedReplicaStays.
//  3. A chain stays finished only whole: a member that restarts restarts
//     the chain. Replicas; TestFinishedChainStaysWhole.
//  4. A replica that stays has its ends written (its end on every queue
//     it feeds, gone on every queue it reads) and is done in a copy of
//     its share's last snapshot; the snapshot merged before keeps its
//     figures. WriteEnds, MarkDone; in package cluster
//     TestSettledAfterLastSnapshot.
//  5. The package starts no goroutine. TestMain fails the package if a
//     goroutine outlives its test.
package finished
