// Package follow is what a worker's share follows of its restartable
// replicas: the runtime around each (Replicas.Wrap: tracked, with its
// inputs and outputs), which keeps the delivery in hand as the replica's
// receipt until the replica asks for its next, keeps what it finished
// for its group's save, drops what a restored state trained on, and
// records the replica settled once it has returned and all it took is
// settled; the share's side of its groups across workers, hooked to the
// replicas (Replicas.Group); the rounds and saves of a group whose
// members all sum in this process (saves.go: localGroup, savingGroup);
// and resuming sources' positions (resume.go). The receipts and the
// ledger that settles them are package settle's, the groups across
// workers package group's.
//
// It reads what it needs of its share through an Env, set once as the
// share starts, and a Share (package share's links), asked as the
// replicas run.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. A restartable replica's delivery in hand is its receipt, which the
//     share follows without a side table: the replica is its holder
//     (trackedIn.Recv, settle.Taken.HeldBy), and what a restored state
//     trained on is dropped as it comes back, settled at once or at the
//     save that holds it (trackedIn.Recv, settle.Taken.Drop).
//     TestLocalSaveNamesEveryMembersItem; in cmd/dflow TestAuditBytes.
//  2. Where a replica's group saves, what it finishes is kept until a
//     save holds the round it was trained in, and what is in hand at a
//     save until the next (tracked.Keeps, tracked.saved,
//     savingGroup.Saved). TestLocalSaveNamesEveryMembersItem.
//  3. A replica that returned is recorded settled only once all it took
//     is settled (tracked.SettledOne, tracked.recordLocked,
//     Replicas.recordSettled). TestSettledRecorded.
//  4. An item taken again whose group across workers cannot say whether
//     it was trained fails the share and is never settled by it, even
//     where the node goes on receiving past the error: acked, it would be
//     lost untrained; handed on, it could be trained twice
//     (tracked.untold, tracked.Keeps). TestUntoldNeverSettled.
//  5. A node's own clock passes through the share's wrappers
//     (clocked). TestOwnClockThroughShare.
//  6. Its one goroutine, a replica's settled record, runs in the share's
//     group, and none starts once the group's close has begun
//     (tracked.recordLocked, Share.Go). TestMain fails the package if a
//     goroutine outlives its tests, and so does package cluster's, whose
//     tests run workers in process.
package follow
