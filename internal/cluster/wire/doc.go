// Package wire is what the coordinator and the shares of a run across
// hosts agree on: the job a worker is sent (Job, Timings), the subjects
// they speak on, the streams, consumers and buckets a run sets up
// (SetupRun, TeardownRun) and the names of what is in them, the records
// shares write there for the coordinator to read (ChainRecord,
// SavesNote, Restore), and the rules on node kinds both sides apply
// (Restartable, Chainable, Moves, Hosted).
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. Both sides name every subject, stream, consumer, bucket and key from
//     the run's id and the graph's indices alone (Subj*, StreamEdge,
//     ConsumerQueue, Bucket*, Key*, EdgeIndex), and a name that comes
//     from a spec or a worker passes Token first: no name one side makes
//     can differ from the other's or reach into another subject.
//     Every cluster test fails without it (TestSeedOnThreeWorkers first).
//  2. An edge's stream is one namespace of ids for all its queues, and
//     keeps ids long enough to drop a duplicate sent again after a loss
//     (SetupRun: Duplicates). TestPlacedOnce (package share).
//  3. A queue's stream and consumer have no bound of their own: a
//     publish is never refused for room (which would let a later one in
//     flight pass it), and a consumer may hold unacked all its stage keeps
//     until settled (a group's inputs until its save); the producers'
//     credit holds the capacity (package edge, rule 4). SetupRun;
//     TestQueueHoldsItsCapacity (package share).
//  4. A chain's stages are restartable and keep nothing past an item: no
//     state that moves, no group. Chainable; TestKinds.
//  5. A share's chain record, once sealed, is never written again: every
//     write of the share expects the revision of its last, and SealChain
//     stores the seal by the same compare and set. SealChain;
//     TestChainRecordSealed (package settle).
//  6. A stream head settled by n shares is counted once: what it derived
//     comes off n-1 times. ChainTwice; TestChainTwice.
//  7. Every share of a run keeps the coordinator's lease and ack wait: the
//     coordinator fills the defaults once (Timings.WithDefaults) and sends
//     them in the Job.
//  8. The package starts no goroutine.
package wire
