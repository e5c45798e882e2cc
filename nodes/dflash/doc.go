// Package dflash provides the DFlash pipeline's nodes: target_forward (a
// frozen target LM that emits hidden states and its greedy tokens) and
// drafter_train (a block drafter trained data-parallel on them, its
// acceptance length measured as it trains).
//
// The package exports only what a user of these node kinds needs:
// Register, the item type (HiddenStates, an alias of items.HiddenStates)
// and its type name (HiddenType), and DefaultLayers. The models are in
// internal/nn (the target, nn.Model, and the drafter, nn.Drafter), the
// speculative-decoding evaluation that dflow eval also runs is in
// internal/speceval, and no exported name here mentions either.
//
// Invariants: the target is frozen and shared read-only by every replica
// of a process (loaded once per path and content hash). Every drafter
// replica holds identical weights after each completed step (the
// gradient is all-reduced before the update); the last replica to finish
// writes the checkpoint, and a run cut short writes its last completed
// step. A checkpoint records the target it was trained against (path and
// SHA-256) and the run that wrote it; a different run never replaces it
// unasked.
package dflash
