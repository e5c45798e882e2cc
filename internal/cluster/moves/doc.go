// Package moves is a rebalance's record across hosts and its decisions:
// where a rebalanced stage's spare slots go (Slots), which replica each
// move takes away and which slot it starts (Book.Plan), which stages'
// slots are let go (Book.Release), what a user sees of the slots
// (Book.Visible) and of those that never ran in the report
// (Book.Report), and what a share that takes over a lost worker is told
// (Book.Job). The coordinator (package cluster, moves.go) asks the
// shares to make the moves and records each once a share took it
// (Book.Made, Book.Told); a worker makes its part of each in its engine
// (package engine's parked.go).
//
// How a move goes. Every rebalanced stage gets spare slots, parked
// replicas of its own: on each worker as many as the rebalanced replicas
// placed there, so that any device there may go to any of the stages. A
// move of a replica from stage A to stage B picks a running replica of A
// on a worker where another replica of A runs and a slot of B is
// parked; that worker's share lets the replica leave after its item in
// hand and starts the slot on its device once it has. A group stage's
// members move too (package group/host: a slot joins as a restart
// does; a member a move takes away never comes back, Host.Moved), but
// not a group that restarts whole; a spare replica of the budget (a move
// from no stage) has no device to start on.
//
// It reads what the coordinator knows through a View the coordinator
// builds under its own lock, and the run's graph; a Book has a lock of
// its own, taken after the coordinator's.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. Each rebalanced stage gets, on each worker, as many spare slots as
//     the rebalanced replicas placed there, after its own replicas.
//     Slots, New; TestSlotsFollowDevices.
//  2. A move takes a replica only where another replica of its stage
//     keeps running on the same worker (that share's side of the
//     stage's input holds what it fetched for the replicas there), the
//     highest first, never one taken already, and starts a slot of the
//     other stage parked on that worker that no move started; a move
//     that cannot be placed is said once for each reason. Book.pick,
//     Book.Plan; TestPickKeepsOne.
//  3. A stage's slots are let go once every replica feeding its input is
//     done as the share that runs it says (a slot started then would
//     find nothing), or every stage's once the run is over; each live
//     share running one is asked until it said so. Book.Release,
//     Book.Told; TestReleaseOnceInputsEnd.
//  4. A user sees a rebalanced stage's own replicas, then the slots in
//     the order moves started them (a replica keeps its place from one
//     snapshot to the next), never a slot no move started, among the
//     replicas or an edge's producers; the run's report leaves out the
//     slots that never ran, among the replicas and an edge's producers
//     and consumers. Book.Visible, Book.Report; TestVisibleOrder,
//     TestReportLeavesOutSlots.
//  5. A share taking over a lost worker is told the slots moves
//     started, the stages whose slots are let go and the replicas moves
//     took away, so it runs the slots and not those replicas; one that
//     held its group's state when lost is brought back (Book.Back) and
//     restarts. Book.Job; TestPickKeepsOne, and in package restarts
//     TestLoseMovedMember.
//  6. The package starts no goroutine.
package moves
