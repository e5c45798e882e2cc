// Package group is a stage's replica group whose members sit on several
// workers, as its members see it, and the wire they share with its host:
// each worker's share has a Member, the engine's RemoteGroup, whose
// barrier, all-reduce, leave, keep and save calls are requests to the
// group's host on dflow.r.RUN.grp.STAGE; the coordinator hosts the group
// (package host, below this one: a Host per stage). The wire (one op
// byte, the replica, the arguments; an answer's status byte) is
// described at the op codes in group.go, with what the host does with
// each; a vector crosses as little-endian float32s (Encode, Decode), in
// parts that each fit in a message (PartValues). A member's side is
// member.go. What a member's calls do to the share's inputs (hold them
// until a save, settle them, drop the items a restart trained on
// already) are hooks the share sets (Member.Held, Settle, Skip, Hold,
// Stepped, Durable), and whether an item that comes again was trained is
// a call the share makes (Member.Trained); this package knows no queue.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it. A rule the host keeps too names its functions
// (package host has the same rule); the tests that play members against
// a real host are package host's, or this directory's package group_test
// (which reaches a member's insides through export_test.go).
//
//  1. Where the state moves (Spec.Moves), a lost member's restart takes
//     the state a present member hands over as of its last step, is told
//     the item of the lost member's last completed step (dropped if it
//     comes back), and the round under way waits for it.
//     Member.requestAs, Member.donate, Member.Keep, and package host's
//     Host.Lose, Host.stateLocked, Host.answerJoinLocked; in package
//     host TestGroupLostMember.
//  2. An item that comes again from a shared queue (its first member's
//     share lost, or stopped keeping it) is dropped by whichever member
//     takes it where a completed round trained it, settled at once or at
//     the save that holds that round (the member keeps it as if it had
//     trained it: a restore needs it back); one in hand in the round under
//     way is answered once that round completes or that arrival is
//     dropped, the asker's wait bounded (package follow). What a lost
//     member trained stays counted through later saves (it settled none
//     of it). Member.Trained, and package host's Host.askLocked,
//     Host.orphans; in package host TestTrainedInHand,
//     TestMovedMemberDrops, TestAskerKeepsForRestore,
//     TestLostTrainedOutlivesSaves, and in cmd/dflow
//     TestRebalanceGroupWorkerLost.
//  3. A leave whose donation fails leaves all the same, and another
//     member is asked. Member.Leave, and package host's Host.leaveLocked;
//     in package host TestDonorLeaves.
//  4. A member whose collective ends on its context before its answer
//     came is out of that round, as a member in process is, and so is
//     one whose collective fails otherwise (a donation asked for first
//     that failed, a request that failed): it withdraws its arrival
//     (OpWithdraw, naming it), and the host takes the arrival and its
//     vector out, so that the round completes with the members still
//     waiting, summing only theirs, or with this one when it comes again;
//     a round that arrival had completed counts for it as for the others
//     (the answer is the round's). So every member present takes
//     every step the group completes, and the last to leave holds the
//     last step. A state it was sending will not come: another member is
//     asked. Member.arrival, Member.withdraw, and package host's
//     Host.withdrawLocked; TestGroupGaveUpWithdraws,
//     TestGaveUpAfterTheRound (package group_test), and in package host
//     TestGaveUpDonating, TestFailedDonationWithdraws.
//  5. A vector crosses as little-endian float32s, bit for bit, whatever the
//     machine. Encode, Decode; TestVectorWire.
//  6. The package starts no goroutine: a Member's calls run on the
//     caller's. TestMain fails the package if a goroutine outlives its
//     tests (package group_test's too).
package group
