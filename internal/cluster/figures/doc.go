// Package figures is the run's figures across hosts and their books: the
// shares' snapshots and reports merged into the run's (Snapshot, Report),
// a lost share's counts as its last snapshot had them and, once the run
// is over, as its streams and chain records say (Streams), and the check
// that fails a run whose counts disagree (books.go says where each figure
// comes from, and which are counted apart from which).
//
// It reads what the coordinator knows through a Run, which the
// coordinator builds under its own lock and keeps while the figures read
// it; the figures keep nothing of it. What they read of the broker goes
// through Streams, once every share is done.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. A replica's figures are those of the share that runs it, plus what
//     lost shares that ran it did, as their last snapshots had it, named
//     by their workers ("a>b" after a restart); a lost share's edges
//     likewise. mergeStage, mergedStage, lostReplica, lostEdge; TestBooks
//     ("a lost share settled").
//  2. A queue's depth in the run's snapshot is the reading, among the
//     shares that run one of its ends, that the coordinator had last;
//     once every share is done, a remote queue's is its stream's then
//     (End.Depth, as Streams.Unread read it). latestDepth;
//     TestQueueDepthAsLastRead.
//  3. A run that completed counts an edge whose queues all ride a stream
//     by the stream (produced what it stored, duplicates dropped;
//     consumed what of that was acked), and a chain's edge by the chain
//     records: a lost share's part as it recorded it settled, a live
//     share's less what it did again of a lost one's heads, a head
//     settled twice once. An item done twice (its worker lost before it
//     was settled) is counted once. mergedEdge, Streams.Totals,
//     Streams.Chains, wire.ChainTwice; TestBooks ("balanced on streams"),
//     and in cmd/dflow TestAuditChain.
//  4. A lost share's part of a restartable stage is settled to what the
//     stage's edges say it took and sent, never below nothing, a
//     replica's taking and sending together. settleLost; TestSettleLost,
//     TestSettleLostTogether.
//  5. There is no run's report without its books: a run whose books do
//     not balance (an edge's produced, consumed, the producing stage's
//     sends, the consuming stage's takes and the sources' totals
//     disagree) fails, naming the edge and the counts; it never ends ok.
//     Report, checkBooks; TestBooks.
//  6. A run whose shares have all ended while a remote queue's stream
//     still holds items fails: a consumer must read its input to the end.
//     Streams.Unread; in package cluster TestLargeItemsNobodyReads.
//  7. The package starts no goroutine. TestMain fails the package if a
//     goroutine outlives its test.
package figures
