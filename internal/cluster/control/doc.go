// Package control is the part of a run's control that needs no broker:
// where replicas go (Place, Queues), what a worker lets a job touch
// (Roots), and how the side that waits on a lease judges it (LeaseWatch,
// Pauses). The coordinator's and the workers' use of them (membership,
// heartbeats, restarts of lost replicas, end keys, the deadlock watch)
// sits with the Coordinator and the worker in package cluster, whose
// state they are.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. Replicas go to the workers in turn, stage after stage in the spec's
//     order, except that replicas a chainable edge joins sit on one
//     worker. Place; TestPlace, TestPlaceChains.
//  2. An edge between chainable stages whose every queue is one
//     producer's to one consumer on one worker is a chain's, in process;
//     parted by a pin, it rides a stream. Queues; TestPlaceChains.
//  3. Any other queue rides a stream where its producers and consumers are not all
//     on one worker, where it feeds a stage that restarts elsewhere after
//     a loss (what that stage has not finished outlives its worker), and,
//     on an edge of several queues, where such a stage sends on it (an
//     item sent again by another replica meets the first in one stream,
//     which drops it). Queues; TestPlace.
//  4. Silence past the lease counts the other side gone only once it has
//     been asked directly and did not answer, and time the judging process
//     was itself paused (a tick later than pauseAfter) does not count.
//     LeaseWatch.Gone, Pauses.Check, Pauses.Since; TestLeaseWatch.
//  5. Every path a node kind declares resolves, links followed, under the
//     worker's roots: written ones under Write, read ones under Read or
//     Write; a path to be made is checked by the folder it would be made
//     in; a link to nothing is refused. Roots.Check, Roots.CheckRead;
//     TestRootsAllow, and in package cluster
//     TestWorkerRefusesCheckpointOutsideRoots and
//     TestWorkerRefusesCorpusThroughSymlink.
//  6. The package starts no goroutine.
package control
