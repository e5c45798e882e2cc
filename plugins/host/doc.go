// Package host is dflow's side of plugins: it finds plugin executables
// (./plugins, $DFLOW_PLUGIN_DIR, a spec's plugin blocks), starts them with
// go-plugin, registers their node kinds so specs validate against them like
// built-ins, and runs each replica of a plugin stage in a plugin process of
// its own, streaming items through gRPC with credit per port.
//
// Invariants:
//   - No plugin process outlives dflow, however dflow ends: each runs in a
//     process group of its own that is killed with it, gets SIGKILL when
//     the thread that forked it dies (Linux), and holds a lifeline on its
//     stdin that the SDK and the Python module watch.
//   - A start that does not complete within Host.StartTimeout kills the whole
//     process tree, whatever a wrapper script does.
//   - Items cross in the encoding their port type means (package items);
//     an item of another type, beyond a port's credit, or on a port the
//     kind lacks fails the replica with an error naming the port.
//   - Shared memory (large items by reference) is per replica: its two
//     memfd pools are unmapped when the replica ends, however the plugin
//     ended, and have no name to leave behind; a full pool sends bytes
//     instead of waiting.
//   - A crash or a panic fails only its replica, with the plugin's last
//     stderr lines or the panic's message.
//   - dflow offers protocol versions 1 and 2; a kind that says group
//     (version 2 only) is registered with Spec.Sync, each replica starts
//     with torchrun's environment and its device bound by
//     CUDA_VISIBLE_DEVICES, and its Collective messages run in the
//     stage's group in the engine (group.go).
//   - In one process, a group kind that restores whose stage allows
//     restarts restarts whole when a rank's process dies: every member
//     stopped and started again, told the last save's step, given back
//     first the items it took since that save, once; what is kept is
//     released at each save (restart.go).
package host
