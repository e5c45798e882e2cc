// Package deadlock is the coordinator's deadlock watch over a run across
// workers.
//
// No worker's engine sees a whole run across hosts: what a queue on a
// stream holds, and who has arrived at a group the coordinator hosts, are
// elsewhere. So each engine's detector leaves those waits alone, and its
// snapshots say what each replica waits on (report.Wait); the watch
// judges the whole run by the engine's rule, from a View the coordinator
// builds of what it knows at each look (the shares' latest snapshots, the
// groups it hosts, when it last counted a worker lost) and the streams'
// counts, read through the View. The run is deadlocked when every
// replica still running is in a wait that cannot end, each waiting for
// replicas that are stuck too:
//
//   - an input on queues that are all empty (a stream holding no message
//     waiting to be delivered, nothing at hand on the consumer's worker) with
//     producers still running;
//   - room on a queue that is full (its capacity waits to be delivered) with
//     consumers still running;
//   - a group step its member has arrived at (the coordinator holds its
//     request) that members still present have not;
//
// and nothing moved (no item produced or consumed anywhere, no group step,
// no replica ended, no stream's count changed) over the confirmation
// window, on at least three looks. The deadlock it returns
// (*engine.Deadlock) names the cycle, each replica with its worker, and
// the fix, as one engine names its own.
//
// Its invariants, each with the function that keeps it and a test that
// fails without it:
//
//  1. A deadlock is judged only on a stuck state unchanged (every
//     replica's items in and out, the replicas done, the hosted groups'
//     steps and the streams' counts) and seen three times over the
//     confirmation time; anything that moves starts the count again.
//     Watch.Judge; TestJudge, and in package cluster
//     TestNoDeadlockWhileSlow.
//  2. A replica counts as able to move, and the run as not stuck, when
//     it is working or in a wait its engine can see end, when its share
//     has said nothing of it yet, when its share is counted lost and it
//     had not finished, and while a lost worker's replicas may still
//     restart (restartQuiet after the loss). settled, look.replica;
//     TestJudge.
//  3. A wait on a queue that rides a stream is judged by the stream:
//     empty for an input (nothing waiting to be delivered), full for room
//     (its capacity waiting, as the producers' room counts it); a stream
//     that cannot be read counts as
//     able to move. look.recv, look.send, look.streamMsgs; TestJudge.
//  4. A wait at a group across workers is stuck only once its member has
//     arrived at the coordinator's host and members still present have
//     not. look.group; TestJudge, and in package cluster
//     TestDeadlockAcrossWorkers.
//  5. The package starts no goroutine, and keeps nothing of a View.
//     TestMain fails the package if a goroutine outlives its test.
package deadlock
