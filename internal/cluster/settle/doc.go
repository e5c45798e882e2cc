// Package settle settles what a worker's share takes for its restartable
// stages: each item comes with a receipt (Taken: from a queue on
// JetStream, Ledger.Take; from a resuming source, Position.Item; on a
// chain's edge in process, Ledger.Chain) that travels with it through the
// engine, and the share's ledger acks it in batches once it is settled,
// records the chains' figures before those acks and the resuming
// sources' positions after them. What the ledger asks of its share
// (its worker's name, whether it was counted lost, failing it) is the
// Share interface; what it asks of the replica that took an item
// (whether it keeps it for a save, that it is settled) is the Holder
// interface; packages share and follow implement them. How it all makes exactly
// once across a lost worker: ledger.go says it at length, chain.go for
// chains, resume.go for sources.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. What a replica sends in a chain has an id derived from the delivery
//     it holds (chainEdge.Derive, Taken.ID, edge.DerivedID), as on a
//     queue on JetStream (package edge, rule 1), so a restart's
//     duplicate is dropped further on; an input at a chain's head is
//     settled only once all the chain derived from it is (Taken.child).
//     TestChainDerives; in cmd/dflow TestAuditChain.
//  2. An input is settled by one rule, for every item type: once its
//     replica has let it go and every publish of what was sent from it
//     has the server's answer (Taken.Done, Taken.Finish,
//     Taken.answered), or, where its replica keeps it for a save, once a
//     save holds it (Holder.Keeps); it goes to the ledger once, whatever
//     a node does. Nothing follows an item by its pointer.
//     TestTakenSettledOnce; TestLocalSaveNamesEveryMembersItem (package
//     follow); in cmd/dflow TestAuditBytes and TestAuditChain.
//  3. A settled item is acked, and kept from redelivery until the server
//     has the ack (a flush), its bytes released and its replica told
//     only then (Ledger.Settle). TestSettledRecorded (package follow); in
//     cmd/dflow TestCrashAfterSend.
//  4. Once its share is counted lost, the ledger settles nothing more
//     (Ledger.Settle, Share.Released), so what it held reaches the share
//     that took over. TestSettleLost (package figures) and the kill tests
//     of cmd/dflow.
//  5. A chain's figures are recorded before its heads are acked, each
//     record by compare and set on the last; once the coordinator sealed
//     the record, the ledger acks nothing more (Ledger.recordChains,
//     errSealed). TestChainRecordSealed.
//  6. A resuming source's position moves only past items all settled,
//     and is written after the settle that moved it, within recordEvery,
//     and with the chain record where it passed a chain's head
//     (Position.settled, Ledger.settle, Ledger.record); a restart takes up
//     there (Ledger.Resume). TestPositionRecordedAtMostEvery; in cmd/dflow
//     TestSourceLost, TestBytesSourceLost and TestCrashAfterSend.
//  7. The package starts no goroutine: the ledger's Run runs in its
//     share's background group and ends once Env.Stop is done. TestMain
//     fails the package if a goroutine outlives its tests, and so does
//     package share's, whose tests run the ledger in a share.
package settle
