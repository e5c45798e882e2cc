package nodes

// Quiescer is implemented by a node whose replicas wait on goroutines and
// contexts of their own (the plugin host does), to let the engine's
// deadlock detector see through them. While Quiescent(replica) reports
// true, nothing the node does for that replica can move by itself: every
// goroutine of it is either inside a wait on one of the replica's ports
// (a Recv or a Send, whatever its context) or blocked on something only
// such a wait, or another replica, can end. The detector then judges every
// wait in progress on the replica's ports, as it judges a single wait of a
// plain node (docs/runtime.md, "Deadlock"). A node that cannot tell
// reports false, and its replicas count as able to move.
type Quiescer interface {
	Quiescent(replica int) bool
}
