// Package restarts decides what a lost share's replicas become: which
// stay (finished), which restart and on which worker, which fail the run;
// what a replica lost does to its group across workers (a member lost,
// one a move took away, a group lost whole and restoring its last save,
// one that cannot go on without any member and restarts whole), and which
// other shares a group's restore counts lost (evicts) to have its members
// back. It keeps the record of what groups restore: the saves the local
// groups (summing on one worker) said they made, the restores of those
// lost whole, and the attempts of those that restart whole (Book).
//
// The coordinator (package cluster, membership.go) finds a share lost,
// asks package finished which of its replicas had finished, seals its
// chain record, and then asks Book.Lose under its own lock, over a View it
// builds there (its shares, where each replica runs, the groups it hosts,
// a rebalance's record); it counts lost the shares Lose evicted, writes
// the ends of the replicas that stay, logs what Lose said and starts the
// restart on View.LeastLoaded's worker. This package does no I/O and
// starts no goroutine; a Book has a lock of its own, taken after the
// coordinator's.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. A lost share's replica stays where its worker recorded it settled
//     (package finished), marked done in a copy of the share's last
//     snapshot, or where that snapshot has it done; else it restarts if
//     its stage can restart elsewhere, and fails the run if it keeps
//     state, saying why the share is over (its worker silent, or a
//     group's restore that needs it back). Book.Lose;
//     TestLoseStaysOrMoves, and in package cluster
//     TestSettledAfterLastSnapshot.
//  2. A restart goes to the live worker running the fewest replicas,
//     never one counted gone. View.LeastLoaded; TestLeastLoaded, and in
//     package cluster TestRestartPassesOverGoneWorker.
//  3. A member lost leaves its group; a group whose state moves needs a
//     member left to take it from, or a save to restore, else the run
//     fails naming the stage. A member a move took away leaves its group
//     for good, unless it held the group's state (it left last, or was
//     the last present): then it restarts as any lost member does.
//     loss.member; TestLoseMember, TestLoseMovedMember.
//  4. A group lost whole restarts from the last save the coordinator
//     holds (a hosted group's, or the last a local group's live share
//     said: Book.Note), its members told the step, and what a save holds
//     is never trained again; a member that had finished since the save
//     comes back, its share counted lost, only where everything else it
//     runs can restart or has finished, else the run fails for the
//     restore, not for a worker lost. loss.member, loss.evictable,
//     Book.Note; TestEvictForRestore, TestFirstNoteBeforeASave, and in
//     package cluster TestLostWholeAsMemberFinished and
//     TestLastMemberLostBeforeFinalSave.
//  5. A group that cannot go on without any member (Spec.Whole) restarts
//     whole: every share running another member is counted lost, once
//     for each loss, and the group restores its last save in a new
//     attempt (Job.Attempt), another if a restart is lost during the
//     restore. loss.whole; TestLoseWhole, TestLoseWholeTwoOnLostWorker,
//     TestLoseWholeDuringRestore.
//  6. The package starts no goroutine. TestMain fails the package if a
//     goroutine outlives its test.
package restarts
