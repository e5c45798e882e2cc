// Package sdk is what a dflow plugin is written with: Serve (ServeWith
// and Options to tune it), Stderr, and, for items received by reference
// in shared memory, Detach and Shared. What the plugin and dflow share on
// the wire (the handshake, the codec, credit, batches, the pools) is
// package plugins/internal/wire; dflow's side is plugins/host.
//
// A plugin implements node kinds exactly as built-in nodes do (nodes.Spec:
// a graph.Kind with config schema and ports, and a constructor of a
// nodes.Node) and calls Serve from main:
//
//	func main() { sdk.Serve(mySpec) }
//
// Stdout belongs to the protocol; a plugin logs to stderr, which dflow
// forwards prefixed with the stage and replica.
//
// Invariants:
//   - A plugin built on the SDK links graph, nodes, items and the
//     protocol, and neither dflow's runtime nor its models; its tests run
//     its nodes in process with package sdk/sdktest.
//   - Items cross in the encoding registered for their Go type (package
//     items); Send checks an item against its port's type and waits for
//     the port's credit, so a slow output holds back only itself.
//   - A panic in a node ends that replica with the panic's message; the
//     process serves on.
//   - A replica is a session (session.go): its node runs on the stream's
//     goroutine, a sender and a receiver run beside it, the sender ends
//     before Done and the pools are unmapped only once the receiver is
//     done with them too.
//   - On Linux, items of 64 KiB or more cross by reference in
//     shared memory (two memfd pools per replica, no names); an item
//     received so is a read-only view, valid until the node's next Recv
//     on its port unless sent on first (docs/plugin-protocol.md, Shared memory).
//   - The plugin measures where each replica's time goes (times.go): its
//     node's waits in Recv are idle, in Send blocked (a moment when
//     both wait, from two goroutines, counts once, as blocked), the rest
//     busy, and an item's service time runs from one Recv (on any port)
//     to the next, less the waits; it tells
//     dflow every 100 ms while they change and before Done (Times), and
//     dflow shows them as the replica's (docs/plugins.md, "Busy, idle and
//     blocked").
//   - The plugin exits when dflow does: when its lifeline (stdin) closes
//     or its parent changes.
//   - A kind with Spec.Sync is a group kind (protocol version 2, which
//     the plugin answers where dflow offers it): each replica is a rank
//     with torchrun's environment, and its Group()'s collectives are
//     Collective messages that dflow runs in the stage's group
//     (group.go); Steps gives a member its input in lockstep with the
//     others (docs/groups.md).
package sdk
