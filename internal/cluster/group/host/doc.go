// Package host is the coordinator's side of a stage's replica group whose
// members sit on several workers: a Host per stage, answering its
// members' requests on dflow.r.RUN.grp.STAGE (package group's Member
// sends them; the wire, the op codes and what the host answers to each,
// is described in package group's group.go). It completes a round when
// every member still present has arrived, sums the vectors, takes a
// member's leave, loss or withdrawal out of the round under way, hands a
// lost member's state to its restart or a rebalance's slot, restores a
// group lost whole to its last save (naming the finished members that
// restore needs back: Evictions), and answers whether an item that comes
// again was trained. The coordinator (package cluster) makes the hosts,
// subscribes each to its stage's subject, and tells it of losses (Lose,
// LeftLost, LoseMoved) and moves (Park, Moved). State and SetState are
// for tests of the coordinator's side of a loss.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it. A rule a member keeps too names its functions
// (package group has the same rule); the tests that play members
// against a host are this package's, and package group_test's in
// package group's directory.
//
//  1. A round completes when every member still present has arrived, and
//     every arrived member gets the same sum, added in arrival order.
//     Host.Handle, Host.completeLocked, sumOf; TestGroupAcrossWorkers.
//  2. A leave is a request too and can itself complete the round the
//     others wait in (the uneven-ends rule); a member that left takes part
//     in no collective; the last member to leave is told so, once.
//     Host.leaveLocked; TestGroupAcrossWorkers.
//  3. A vector larger than a message crosses in parts, and its sum comes
//     back in parts; a member that leaves or is lost mid-vector adds
//     nothing to the round's sum. Host.addPartLocked, Host.fetchLocked,
//     Host.leaveLocked, Host.dropLocked; TestGroupAcrossWorkers,
//     TestGroupPartialVector, TestGroupLostMember.
//  4. A member lost with its worker is out of the round under way (its
//     vector dropped, its step counts for nothing), and what its lost share
//     asks after is refused. Host.Lose; TestGroupLostMember.
//  5. Where the state moves (Spec.Moves), a lost member's restart takes the
//     state a present member hands over as of its last step, is told the
//     item of the lost member's last completed step (dropped if it comes
//     back), and the round under way waits for it. Host.Lose,
//     Host.stateLocked, Host.answerJoinLocked, and package group's
//     Member.requestAs, Member.donate, Member.Keep; TestGroupLostMember.
//  6. A group that saves, lost whole, restores its last save: each restart
//     is told the save's step and the items trained on up to it, not after;
//     the restarts are waited for from their first step; a member that
//     finished after the save is named for eviction and restores too; a
//     group that saves nothing cannot restore, and says why.
//     Host.restoreLocked, Host.Evictions, Host.Why; TestGroupLostWhole,
//     and in package restarts TestEvictForRestore.
//  7. A member that had finished on a lost worker has left, once, even
//     where its leave never came. Host.LeftLost; TestLeftLost.
//  8. The package starts no goroutine: a Host answers on the goroutine of
//     the subscription it is given to. TestMain fails the package if a
//     goroutine outlives its tests.
//  9. A rebalance's slot joins by a move as a restart does (it takes the
//     state a present member hands over, or nothing where the state does
//     not move, or where every member has finished and the last holds the
//     state); a join waiting when the last member leaves is answered.
//     Host.Park, Host.Handle (OpJoin), Host.leaveLocked;
//     TestMovedMemberDrops, TestJoinAfterTheEnd.
//  10. A member a move takes away does not come back: lost before its
//     leave it leaves, and a restore of a group lost whole leaves it out,
//     counting its share lost so that what it trained after the save comes
//     back, to be trained again; but one that holds the group's state when
//     lost (it left last, or is the last present) is lost as any member is.
//     Host.Moved, Host.LoseMoved, Host.restoreLocked;
//     TestMovedLostBeforeLeave, TestMovedNotRestored, and in package
//     restarts TestLoseMovedMember.
//  11. An item that comes again from a shared queue (its first member's
//     share lost, or stopped keeping it) is dropped by whichever member
//     takes it where a completed round trained it, settled at once or at
//     the save that holds that round (the member keeps it as if it had
//     trained it: a restore needs it back); one in hand in the round under
//     way is answered once that round completes or that arrival is
//     dropped, the asker's wait bounded (package follow). What a lost
//     member trained stays counted through later saves (it settled none
//     of it). Host.askLocked, Host.orphans, and package group's
//     Member.Trained; TestTrainedInHand, TestMovedMemberDrops,
//     TestAskerKeepsForRestore, TestLostTrainedOutlivesSaves, and in
//     cmd/dflow TestRebalanceGroupWorkerLost.
//  12. A leave whose donation fails leaves all the same, and another
//     member is asked. Host.leaveLocked, and package group's
//     Member.Leave; TestDonorLeaves.
//  13. A member whose collective ends on its context before its answer
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
//     asked. Host.withdrawLocked, and package group's Member.arrival,
//     Member.withdraw; TestGaveUpDonating, TestFailedDonationWithdraws,
//     and in package group_test TestGroupGaveUpWithdraws,
//     TestGaveUpAfterTheRound.
package host
