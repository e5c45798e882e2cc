// Package dataplane is a worker share's data plane: an item's bytes past the threshold go from the worker
// that holds them to the worker that consumes them, directly, over HTTP;
// the queue's message on JetStream carries only a reference (the holder's
// address, the item's size, and with TLS the holder's certificate's
// fingerprint). HTTP because it is made for bulk bytes: one GET streams an
// item at the wire's speed from the producer's own memory (the encoding's
// parts, not copied), with no framing of ours and no per-message limit, and
// every host has a client; the broker carries the small control messages it
// is good at.
//
// Lifetime: the producer's share keeps an item's bytes from its Send until
// the consumer has acked the item's message (then the consumer releases
// them, DELETE), never by a timer; a share that ends keeps serving until
// everything it holds is released or the run is aborted. A redelivered
// message (its consumer lost) is fetched again from the holder. A holder
// that is gone fails the consumer's fetch, and the run, naming the worker:
// the bytes are nowhere else.
//
// Protection, as the broker's: every request shows the run's data key
// (Job.DataKey, which only a holder of the cluster's token or credentials
// reads, in the job); a request without it is refused (401). Where the
// broker speaks TLS the data plane does too, with a certificate each share
// makes for itself, pinned by its fingerprint in the reference (which
// reaches the consumer over the broker's TLS).
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. An item's bytes are held from Put until Drop, never by a timer, and
//     served (GET) while held; a second Put of the same id holds nothing
//     more. Plane.Put, Plane.Drop; TestHeldUntilDropped.
//  2. The input a held item derives from is settled only after its bytes
//     are dropped: told once at Put (Input.Derived) and once at the first
//     Drop (Input.Answered), on the dropping goroutine after the plane's
//     lock is let go. Plane.Put, Plane.Drop; TestHeldUntilDropped.
//  3. A share's end waits for what it holds: Drained returns only once
//     nothing is held (or its context ends), and meanwhile drops what no
//     consumer will release: an item whose message the stream no longer
//     stores, or whose queue has no consumer left. Plane.Drained,
//     Plane.sweep; TestHeldUntilDropped, TestSweep.
//  4. Bytes held again for a message that stands after their first holder
//     was lost (Rehold) are dropped once the stream no longer stores that
//     message, queue by queue. Plane.SweepReheld; TestSweep.
//  5. Nothing is served to a request without the run's data key, and with
//     TLS a consumer accepts only the certificate the reference pins.
//     Plane.ServeHTTP, Plane.clientFor; TestRefusesStrangers.
//  6. A consumer reaches a holder at the first of its addresses that takes
//     a connection, the one that answered last tried first. Plane.do;
//     TestAddresses.
//  7. The plane's one goroutine is its server's: Close shuts it down and
//     waits for it to return. Plane.Close; the package's TestMain (goleak)
//     fails the tests if a plane's goroutine outlives them.
//
// The queue's side (which message refers to which bytes, refetching from
// a holder recorded after a loss) is the edge's, in package cluster.
package dataplane
