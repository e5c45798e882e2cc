package group

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// A group across workers is hosted by the coordinator (package host):
// each member's collective is a request on dflow.r.RUN.grp.STAGE,
// answered when every member still present has arrived; a leave is a
// request too, and can itself complete the round the others wait in (the
// uneven-ends rule, as in process).
//
// A request is one op byte and the replica as a uint32, with headers: the
// share that sends it (a share counted lost is refused: its replicas run
// elsewhere now) and, on a collective, the id of the item the replica has
// in hand (what its step trains on) and an id of the arrival (random, one
// per collective call, on each of its parts). An all-reduce sends its vector
// in parts that each fit in a message (a model's gradients are megabytes;
// a NATS message is 1 MiB by default): each part adds the vector's total
// length and the part's offset as uint32s, then its values as
// little-endian float32s; the last part (offset + values = total) is the
// member's arrival. A leave may add 1 as a uint32: its donation of the
// state failed, and it leaves without being asked again. An answer is a
// status byte (0 ok, 1 error, 2 donate),
// then the error's text, or: for a part before the last, nothing more;
// for an arrival, the contributors and the round as uint32s, then the sum
// when it fits in the answer (or nothing: the member then fetches it in
// parts, OpFetch with the round, an offset and a count); for a leave, 1
// as a uint32 when the member was the group's last.
//
// A member lost with its worker (Host.Lose) is out of the group: its
// arrival in the round under way, if any, is dropped with its vector, so
// its unfinished step counts for nothing, and its item comes back, to its
// restart or, from a shared queue, to whichever member takes it. Where
// the stage's state moves (Spec.Moves), the lost member is due: the
// next collective or leave of a member still present is answered 2
// (donate) with the due member as a uint32; that member sends its state
// (OpState parts: the due member, the total length and the offset as
// uint32s, then bytes), and asks again. With the state in hand the host
// counts the due member present again, so the round under way waits for
// it, and answers its restart's OpJoin: 0, then 1 and the state's length
// as a uint32 (or 0: the member had left the group before it was lost, and
// takes nothing), then the id of the item of its last completed step,
// which the restart drops if it comes back (its gradient is in the model).
// The restart fetches the state in parts (OpStateFetch, an offset and a
// count). A stage whose state does not move (synchronized stateless work)
// takes its restart back at the restart's first collective.
//
// A member whose collective ends before its answer came, on its context
// (an abort, a deadline of its own) or on a failure (a donation asked for
// first that failed, a request that failed), withdraws its arrival
// (OpWithdraw, the arrival's id after the replica), as a member in
// process whose wait ends on its context does: where its arrival, or a
// part of its vector, is in the round under way, the host takes it out
// with its vector (the round's sum is made, as it completes, from the
// members still arrived) and keeps the round open for the others
// and for the member's coming again, answering 0 and nothing more. Where
// that arrival completed a round (its answer crossed the context's end),
// the answer is the round's, as the arrival would have had it: the round
// counts for that member as for the others. Where it is in no round (it
// never came, or the member's leave or loss took it out) the answer is
// 0. So every member present takes every step the group completes, and
// the last to leave holds the last step any member took.
//
// An item that comes again from a shared queue may have been trained in a
// completed round by a member since lost, or that left (a move took it
// away) and whose share was lost since: the member that takes it asks
// (OpTrained, the item's id after the replica), and the answer is 0, then
// 1 and the round a save has yet to hold as a uint32 (0: a save holds
// it), or 0: not trained. An item in hand in the round under way is
// answered once that round completes, or that arrival is dropped.
//
// A rebalance moves members (the coordinator's moves.go): its spare slots
// are parked members (Host.Park: not present); a slot a move starts
// joins by OpJoin as a restart does, taking the state over where it
// moves (and nothing where it does not, or where every member has
// finished: 0). A member a move takes away (Host.Moved) leaves at a step
// boundary and does not come back: lost before its leave it leaves then,
// and a restore of the group leaves it out; unless it holds the group's
// state when lost (it left last, or is the last present: Host.LoseMoved),
// when it is lost as any member is.
//
// Where the group saves, a member that has returned asks OpDone: its
// inputs stay unsettled until the answer, which comes once the group's
// final save holds them (the last member to leave has returned: it wrote
// that save). Until then a group lost whole, its finished members
// included (not those a move took away), restores its last save
// (Host.restoreLocked).
const (
	OpBarrier byte = iota
	OpReduce
	OpLeave
	OpFetch
	OpJoin
	OpState
	OpStateFetch
	OpSaves
	OpSaved
	OpDone
	OpTrained
	OpWithdraw
)

// The headers of a group request, and of an answer (HdrSaved: the round
// the group's last save holds, where it saves).
const (
	HdrShare   = "Dflow-Share"
	HdrHeld    = "Dflow-Held"
	HdrArrival = "Dflow-Arrival"
	HdrSaved   = "Dflow-Saved"
)

// TrainedItem is an item a member had in hand in a completed round.
type TrainedItem struct {
	Round uint32
	ID    string
}

// PartValues is how many float32s a message of maxPayload bytes carries
// besides a group request's or answer's header.
func PartValues(maxPayload int64) int {
	return max(int(maxPayload-256)/4, 1)
}

// littleEndian: this machine's float32s are the wire's bytes, so that
// Encode and Decode copy them whole (the vectors are a model's gradient).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// bytesOf is f's memory as bytes.
func bytesOf(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// Encode writes f into b as little-endian float32s.
func Encode(b []byte, f []float32) {
	if littleEndian {
		copy(b[:4*len(f)], bytesOf(f))
		return
	}
	encodeEach(b, f)
}

// Decode reads little-endian float32s into f.
func Decode(f []float32, b []byte) {
	if littleEndian {
		copy(bytesOf(f), b[:4*len(f)])
		return
	}
	decodeEach(f, b)
}

// encodeEach and decodeEach are Encode and Decode value by value, for a
// big-endian machine.
func encodeEach(b []byte, f []float32) {
	for i, v := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

func decodeEach(f []float32, b []byte) {
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}
