// Package group is the collectives of a stage's replica group whose
// members sit on several workers: the coordinator hosts the group (Host,
// one per stage, answering requests on dflow.r.RUN.grp.STAGE) and each
// worker's share has a Member, the engine's RemoteGroup, whose barrier,
// all-reduce, leave, keep and save calls are requests to the host. The
// wire (one op byte, the replica, the arguments; an answer's status byte)
// is described at the op codes in group.go; the host's side is host.go,
// a member's member.go. What a member's calls do to
// the share's inputs (hold them until a save, settle them, drop the items
// a restart trained on already) are hooks the share sets (Member.Held,
// Settle, Skip, Hold, Stepped, Durable), and whether an item that comes
// again was trained is a call the share makes (Member.Trained); this
// package knows no queue.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
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
//     Host.stateLocked, Host.answerJoinLocked, Member.request,
//     Member.donate, Member.Keep; TestGroupLostMember.
//  6. A group that saves, lost whole, restores its last save: each restart
//     is told the save's step and the items trained on up to it, not after;
//     the restarts are waited for from their first step; a member that
//     finished after the save is named for eviction and restores too; a
//     group that saves nothing cannot restore, and says why.
//     Host.restoreLocked, Host.Evictions, Host.Why; TestGroupLostWhole,
//     and in package cluster TestEvictForRestore.
//  7. A member that had finished on a lost worker has left, once, even
//     where its leave never came. Host.LeftLost; TestLeftLost.
//  8. A vector crosses as little-endian float32s, bit for bit, whatever the
//     machine. encode, decode; TestVectorWire.
//  9. The package starts no goroutine: a Host answers on the goroutine of
//     the subscription it is given to, a Member's calls run on the
//     caller's.
//  10. A rebalance's slot joins by a move as a restart does (it takes the
//     state a present member hands over, or nothing where the state does
//     not move, or where every member has finished and the last holds the
//     state); a join waiting when the last member leaves is answered.
//     Host.Park, Host.Handle (opJoin), Host.leaveLocked;
//     TestMovedMemberDrops, TestJoinAfterTheEnd.
//  11. A member a move takes away does not come back: lost before its
//     leave it leaves, and a restore of a group lost whole leaves it out,
//     counting its share lost so that what it trained after the save comes
//     back, to be trained again; but one that holds the group's state when
//     lost (it left last, or is the last present) is lost as any member is.
//     Host.Moved, Host.LoseMoved, Host.restoreLocked;
//     TestMovedLostBeforeLeave, TestMovedNotRestored, and in package
//     cluster TestLoseMovedMember.
//  12. An item that comes again from a shared queue (its first member's
//     share lost, or stopped keeping it) is dropped by whichever member
//     takes it where a completed round trained it, settled at once or at
//     the save that holds that round (the member keeps it as if it had
//     trained it: a restore needs it back); one in hand in the round under
//     way is answered once that round completes or that arrival is
//     dropped, the asker's wait bounded (package share). What a lost
//     member trained stays counted through later saves (it settled none
//     of it). Host.askLocked, Host.orphans, Member.Trained;
//     TestTrainedInHand, TestMovedMemberDrops, TestAskerKeepsForRestore,
//     TestLostTrainedOutlivesSaves, and in cmd/dflow
//     TestRebalanceGroupWorkerLost.
//  13. A leave whose donation fails leaves all the same, and another
//     member is asked. Member.Leave, Host.leaveLocked; TestDonorLeaves.
//  14. A member whose collective ends on its context before its answer
//     came is out of that round, as a member in process is: it withdraws
//     its arrival (opWithdraw, naming it), and the host takes the arrival
//     and its vector out, so that the round completes with the members
//     still waiting, summing only theirs, or with this one when it comes
//     again; a round that arrival had completed counts for it as for the
//     others (the answer is the round's). So every member present takes
//     every step the group completes, and the last to leave holds the
//     last step. A state it was sending will not come: another member is
//     asked. Member.arrival, Member.withdraw, Host.withdrawLocked;
//     TestGroupGaveUpWithdraws, TestGaveUpAfterTheRound,
//     TestGaveUpDonating.
package group
