// Package ranks tells the ranks of a group stage across workers where
// rank 0 listens.
//
// A node that starts a group's replicas as distributed ranks (a plugin's
// group kind: torchrun's environment for each) needs to know where rank 0
// listens as the others reach it. On a cluster the members may sit on
// several workers: the share that runs rank 0 picks a port free on its
// host, on every interface, and records its host's address (the one its
// data plane gives the other workers) with the port under a key of the
// attempt (keyRank0: the stage and the instance that runs rank 0, so a
// group started again elsewhere gets a fresh one); the other members'
// shares read it. A member's local rank counts the members its share
// runs. Package share gives each such node a Placer's Place
// (nodes.WithRankPlacer).
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. Every rank of one attempt of a group meets at one rank 0: its share
//     picks the port once and records it under the attempt's key, which
//     a later attempt (the group lost whole and started again) does not
//     share, whatever instance its jobs name for rank 0 (Placer.Place,
//     keyRank0). TestRankPlaceAttempt.
//  2. A rank's local rank and local world size count the members its own
//     share runs (Placer.Place). TestRankPlaceAttempt.
//  3. A rank of a group that restarts whole waits for a lost peer's
//     restart (PeerLoss) where its group spans workers, and not where
//     every member sits on one worker, whose loss takes them all
//     (Placer.Place). TestRankPlaceAttempt.
//  4. The package starts no goroutine; a member waits for rank 0's
//     address at most rankWait, then fails with words. TestMain fails the
//     package if a goroutine outlives its test.
package ranks
