package host

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/nats-io/nats.go"
)

// Host is the coordinator's side of one stage's group.
type Host struct {
	mu      sync.Mutex
	stage   string
	members int    // present
	left    []bool // not present: left, lost, due, or a parked slot
	// keeps: the members' state moves to a restart (Spec.Moves)
	keeps bool
	gone  map[string]bool // shares counted lost
	// share is the share each member asked from last; lastRound the
	// round it completed last
	share     []string
	lastRound []uint32
	// held is the item each member had in hand at its arrival in the
	// round under way; trained the items of its completed rounds that
	// may not be settled yet: its last where the group does not save,
	// those since the save before the last where it does
	held    []string
	trained [][]group.TrainedItem
	// saves: a member said the group saves (OpSaves); durable the round
	// its last save holds, saveStep its step (-1: none yet), prevDurable
	// the round of the save before
	saves       bool
	durable     uint32
	prevDurable uint32
	saveStep    int
	// lastMember is the member whose leave left none present (-1: none,
	// or a restore since): it holds the group's state until it returns,
	// its final save written; final: it has (OpDone), and done holds the
	// OpDone of members waiting for that
	lastMember int
	final      bool
	done       map[int]*nats.Msg
	// evict lists the finished members that a restore needs back, with
	// their shares still counted live: the coordinator counts them lost
	evict []Eviction
	// restore marks the members of a group lost whole that restore its
	// last save, until their restart's OpJoin is answered
	restore []bool
	// due marks a lost member whose restart needs the group's state;
	// donor the member sending it (-1: none yet), incoming its parts,
	// stash the state received, until the restart has fetched it, and
	// joiner the restart's OpJoin, waiting for it
	due      []bool
	donor    []int
	incoming map[int][]byte
	stash    map[int][]byte
	joiner   map[int]*nats.Msg
	// parked marks a rebalance's spare slot (Park): not present, and
	// present once a move starts it, as a lost member's restart is;
	// moved a member a move takes away (Moved), which does not come back
	// unless it holds the state when lost (LoseMoved)
	parked []bool
	moved  []bool
	// slot marks a slot that joined by a move and waits for the state:
	// with no member left to give it (they all finished), it takes none
	slot []bool
	// orphans are what lost members trained, kept whole: a save prunes
	// a member's list of what it has settled, which a lost member never
	// did (it heard of no save after its loss), and what it kept comes
	// back to whichever member takes it (askLocked)
	orphans []group.TrainedItem
	// asks are the OpTrained requests waiting on a member that has the
	// item asked of in hand in the round under way: answered once the
	// round completes (trained) or its arrival is dropped (not)
	asks map[int][]*nats.Msg
	// answered is the arrival each member completed a round with last,
	// for its OpWithdraw where the answer crossed its context's end
	answered []arrival

	// the round in progress: open once a member has sent anything for it
	open    bool
	arrived []int // the members waiting, in arrival order
	waiting map[int]*nats.Msg
	reduce  bool
	// vecs holds each arrived member's whole vector until the round
	// completes (a member lost before then adds nothing); partial the
	// parts of a vector not yet whole
	vecs    map[int][]float32
	partial map[int][]float32
	total   int
	err     string
	round   uint32
	// last is the sum of the round completed last, as float32s, kept for
	// members fetching it in parts until the next round completes (which
	// needs every member present, so none is still fetching this one)
	last []float32
	// maxAnswer is the largest sum answered inline, in values
	maxAnswer int
}

// New is the host of stage's group of replicas, answering in messages
// of at most maxPayload bytes; keeps: the members' state moves to a
// restart (Spec.Moves).
func New(stage string, replicas int, maxPayload int64, keeps bool) *Host {
	h := &Host{stage: stage, members: replicas, left: make([]bool, replicas), keeps: keeps,
		gone: map[string]bool{}, held: make([]string, replicas), trained: make([][]group.TrainedItem, replicas),
		share: make([]string, replicas), lastRound: make([]uint32, replicas), lastMember: -1, done: map[int]*nats.Msg{},
		saveStep: -1, restore: make([]bool, replicas), parked: make([]bool, replicas), moved: make([]bool, replicas), slot: make([]bool, replicas), asks: map[int][]*nats.Msg{},
		due: make([]bool, replicas), donor: make([]int, replicas), incoming: map[int][]byte{},
		stash: map[int][]byte{}, joiner: map[int]*nats.Msg{}, waiting: map[int]*nats.Msg{},
		vecs: map[int][]float32{}, partial: map[int][]float32{}, maxAnswer: group.PartValues(maxPayload),
		answered: make([]arrival, replicas)}
	for i := range h.donor {
		h.donor[i] = -1
	}
	return h
}

// Park takes a rebalance's spare slots out of the group as the run
// starts: a move starts one (package engine's parked.go), which joins the
// group then as a lost member's restart does (OpJoin, where the state
// moves; its first step, where not).
func (h *Host) Park(replicas []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, i := range replicas {
		if i >= 0 && i < len(h.left) && !h.left[i] {
			h.left[i], h.parked[i] = true, true
			h.members--
		}
	}
}

// LoseMoved takes out member replica, which a move took away, lost with
// share, and reports whether it restarts after all: where it holds the
// group's state (it left last, and has not written the final save, or it
// is the last member present), its loss is any member's (the caller
// loses it: Lose), and a restart restores the last save, or the run
// fails where none can. Else it leaves (LeftLost), its step under way
// counting for nothing, and it does not come back.
func (h *Host) LoseMoved(replica int, share string) (restarts bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastMember == replica && !h.final || !h.left[replica] && h.members == 1 {
		h.moved[replica] = false
		return true
	}
	h.leftLostLocked(replica, share)
	return false
}

// Moved notes that a move takes member replica away (the coordinator's
// moves.go): it leaves at a step boundary and does not come back, to a
// restart or to a restore of the group's last save, unless it holds the
// group's state when lost (LoseMoved).
func (h *Host) Moved(replica int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if replica >= 0 && replica < len(h.moved) {
		h.moved[replica] = true
	}
}

func (h *Host) Handle(m *nats.Msg) {
	if len(m.Data) < 5 {
		m.Respond(errAnswer("malformed group request"))
		return
	}
	op, replica := m.Data[0], int(binary.LittleEndian.Uint32(m.Data[1:5]))
	h.mu.Lock()
	defer h.mu.Unlock()
	if replica >= len(h.left) {
		m.Respond(errAnswer(fmt.Sprintf("replica %d: no such member", replica)))
		return
	}
	share := m.Header.Get(group.HdrShare)
	if h.gone[share] {
		m.Respond(errAnswer(fmt.Sprintf("the share %s was counted lost: stage %q replica %d runs elsewhere now", share, h.stage, replica)))
		return
	}
	h.share[replica] = share
	switch op {
	case group.OpFetch:
		h.fetchLocked(m)
		return
	case group.OpJoin:
		if h.parked[replica] && h.left[replica] {
			// A slot a move started. Where the state does not move it
			// takes nothing, and is present from its first step. After
			// the group's members have all finished it takes nothing
			// either: nothing is left to train (the last member holds
			// the state). Else it takes the state over as a lost
			// member's restart does.
			end := h.members == 0 && (h.lastMember >= 0 || h.final)
			if !h.keeps || end {
				h.parked[replica] = !h.keeps
				h.answerJoinLocked(replica, m)
				return
			}
			h.parked[replica], h.due[replica], h.slot[replica] = false, true, true
		}
		h.joinLocked(replica, m)
		return
	case group.OpState:
		h.stateLocked(m)
		return
	case group.OpStateFetch:
		h.stateFetchLocked(replica, m)
		return
	case group.OpSaves:
		h.saves = true
		h.respondLocked(m, []byte{0})
		return
	case group.OpSaved:
		h.savedLocked(m)
		return
	case group.OpDone:
		h.doneLocked(replica, m)
		return
	case group.OpTrained:
		h.askLocked(m)
		return
	case group.OpWithdraw:
		h.withdrawLocked(replica, m)
		return
	}
	if (h.due[replica] || h.parked[replica] && h.left[replica]) && !h.keeps {
		// a restart of a stage that moves no state, or a slot a move
		// started: present from its first step
		h.due[replica], h.parked[replica], h.left[replica] = false, false, false
		h.members++
	}
	first := op != group.OpReduce || len(m.Data) >= 13 && binary.LittleEndian.Uint32(m.Data[9:]) == 0
	if op == group.OpLeave && len(m.Data) >= 9 && binary.LittleEndian.Uint32(m.Data[5:]) == 1 {
		first = false // a leave whose donation failed: it leaves without
	}
	if first && !h.left[replica] {
		if to := h.undonatedLocked(); to >= 0 {
			h.donor[to] = replica
			ans := make([]byte, 5)
			ans[0] = 2
			binary.LittleEndian.PutUint32(ans[1:], uint32(to))
			m.Respond(ans) // first the state, for the restart of member to
			return
		}
	}
	if op == group.OpLeave {
		ans := []byte{0, 0, 0, 0, 0}
		if h.leaveLocked(replica) {
			ans[1] = 1 // the last member: the group's once-per-run work is its
		}
		h.respondLocked(m, ans)
		return
	}
	if h.left[replica] {
		m.Respond(errAnswer("replica has left its group"))
		return
	}
	if !h.open {
		h.open, h.reduce, h.err, h.total = true, op == group.OpReduce, "", 0
	}
	if op == group.OpReduce {
		if !h.addPartLocked(replica, m.Data[5:]) {
			m.Respond([]byte{0}) // a part before the last: the member sends the next
			return
		}
	} else if h.reduce {
		h.err = "replicas mixed Barrier and AllReduceSum in one step"
	}
	h.held[replica] = m.Header.Get(group.HdrHeld)
	h.arrived = append(h.arrived, replica)
	h.waiting[replica] = m
	h.completeLocked()
}

// errAnswer is an error answer: 1, then the error's text.
func errAnswer(s string) []byte { return append([]byte{1}, s...) }

// undonatedLocked is a due member whose state no member is sending yet,
// or -1.
func (h *Host) undonatedLocked() int {
	if !h.keeps {
		return -1
	}
	for i, d := range h.due {
		if d && h.donor[i] < 0 {
			return i
		}
	}
	return -1
}

// addPartLocked takes one part of a member's vector and reports whether
// it was the member's last: then the whole vector joins the round.
func (h *Host) addPartLocked(replica int, b []byte) (last bool) {
	if len(b) < 8 {
		h.err = "malformed all-reduce part"
		return true
	}
	total, off := int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:]))
	vec := b[8:]
	n := len(vec) / 4
	switch {
	case !h.reduce:
		h.err = "replicas mixed Barrier and AllReduceSum in one step"
	case h.total == 0:
		h.total = total
	case total != h.total:
		h.err = fmt.Sprintf("AllReduceSum buffers differ in length: %d and %d", total, h.total)
	}
	if off+n > total {
		h.err = "malformed all-reduce part: past the vector's end"
	}
	if h.err != "" {
		delete(h.partial, replica)
		return off+n >= total
	}
	p := h.partial[replica]
	if p == nil {
		p = make([]float32, total)
		h.partial[replica] = p
	}
	group.Decode(p[off:off+n], vec)
	if off+n < total {
		return false
	}
	h.vecs[replica] = p
	delete(h.partial, replica)
	return true
}

// fetchLocked answers a part of the last round's sum.
func (h *Host) fetchLocked(m *nats.Msg) {
	if len(m.Data) < 17 {
		m.Respond(errAnswer("malformed fetch"))
		return
	}
	round := binary.LittleEndian.Uint32(m.Data[5:])
	off, n := int(binary.LittleEndian.Uint32(m.Data[9:])), int(binary.LittleEndian.Uint32(m.Data[13:]))
	if round != h.round || off+n > len(h.last) {
		m.Respond(errAnswer(fmt.Sprintf("no sum of round %d at %d+%d (the last round is %d, of %d values)", round, off, n, h.round, len(h.last))))
		return
	}
	ans := make([]byte, 1+4*n)
	group.Encode(ans[1:], h.last[off:off+n])
	m.Respond(ans)
}

// stateLocked takes a part of a member's state for a due member's
// restart; with the last, the due member is present again.
func (h *Host) stateLocked(m *nats.Msg) {
	if len(m.Data) < 17 {
		m.Respond(errAnswer("malformed state part"))
		return
	}
	donor := int(binary.LittleEndian.Uint32(m.Data[1:]))
	to := int(binary.LittleEndian.Uint32(m.Data[5:]))
	total, off := int(binary.LittleEndian.Uint32(m.Data[9:])), int(binary.LittleEndian.Uint32(m.Data[13:]))
	part := m.Data[17:]
	if to >= len(h.due) || h.donor[to] != donor || !h.due[to] || off+len(part) > total {
		m.Respond(errAnswer(fmt.Sprintf("stage %q: member %d's state for member %d is not asked for (or malformed)", h.stage, donor, to)))
		return
	}
	b := h.incoming[to]
	if b == nil {
		b = make([]byte, total)
		h.incoming[to] = b
	}
	copy(b[off:], part)
	m.Respond([]byte{0})
	if off+len(part) < total {
		return
	}
	delete(h.incoming, to)
	h.stash[to], h.due[to], h.donor[to], h.left[to] = b, false, -1, false
	h.members++ // the round under way waits for the restart now
	if j := h.joiner[to]; j != nil {
		delete(h.joiner, to)
		h.answerJoinLocked(to, j)
	}
}

// respondLocked answers m with data and, where the group saves, the
// round its last save holds: a member settles what it trained on up to
// there.
func (h *Host) respondLocked(m *nats.Msg, data []byte) {
	if !h.saves {
		m.Respond(data)
		return
	}
	a := &nats.Msg{Subject: m.Reply, Data: data, Header: nats.Header{}}
	a.Header.Set(group.HdrSaved, strconv.FormatUint(uint64(h.durable), 10))
	m.RespondMsg(a)
}

// askLocked answers an OpTrained: whether the item named in the request
// (its bytes after the replica) was trained in a completed round, by any
// member, where the group's state moves: 0 ok, then 1 and the round a
// save has yet to hold as a uint32 (0: a save holds it), or 0 (not
// trained: the member that asks trains it). An item redelivered from a
// shared queue comes from a member whose share was lost, or that left
// and whose share was lost since, whichever member takes it: trained on,
// it is in the group's state already. One in hand in the round under way
// is answered once the round completes or that arrival is dropped.
func (h *Host) askLocked(m *nats.Msg) {
	id := string(m.Data[5:])
	ans := []byte{0, 0, 0, 0, 0, 0}
	if !h.keeps {
		m.Respond(ans)
		return
	}
	if round, ok := h.trainedRoundLocked(id); ok {
		ans[1] = 1
		binary.LittleEndian.PutUint32(ans[2:], round)
		// The asker keeps it until a save holds that round: a restore
		// of the group lost whole needs it back as if it had trained it.
		if r := int(binary.LittleEndian.Uint32(m.Data[1:5])); round > h.lastRound[r] {
			h.lastRound[r] = round
		}
		m.Respond(ans)
		return
	}
	for _, r := range h.arrived {
		if slices.Contains(strings.Split(h.held[r], ","), id) {
			h.asks[r] = append(h.asks[r], m)
			return
		}
	}
	m.Respond(ans)
}

// trainedRoundLocked finds id among the items trained in completed
// rounds, with the round a save has yet to hold (0: one holds it).
func (h *Host) trainedRoundLocked(id string) (uint32, bool) {
	for _, items := range append(slices.Clone(h.trained), h.orphans) {
		for _, t := range items {
			if t.ID != id {
				continue
			}
			if !h.saves || h.final || t.Round <= h.durable {
				return 0, true
			}
			return t.Round, true
		}
	}
	return 0, false
}

// answerAsksLocked answers again the OpTrained requests waiting on
// member r's arrival, which has completed or been dropped.
func (h *Host) answerAsksLocked(r int) {
	asks := h.asks[r]
	delete(h.asks, r)
	for _, m := range asks {
		h.askLocked(m)
	}
}

// savedLocked takes a member's word that the group's state as of the
// round completed last is saved, as the step in its request.
func (h *Host) savedLocked(m *nats.Msg) {
	if len(m.Data) < 9 {
		m.Respond(errAnswer("malformed save"))
		return
	}
	h.saves = true
	h.prevDurable, h.durable = h.durable, h.round
	h.saveStep = int(int32(binary.LittleEndian.Uint32(m.Data[5:])))
	// What was trained before the save before this one has been settled
	// (its members heard of that save a save ago): no restart needs it.
	// A member that has finished hears of no save: its items wait for the
	// final one, and a restart of it drops them all.
	for r, items := range h.trained {
		if h.left[r] && !h.due[r] {
			continue
		}
		h.trained[r] = slices.DeleteFunc(items, func(t group.TrainedItem) bool { return t.Round <= h.prevDurable })
	}
	h.respondLocked(m, []byte{0})
}

// joinLocked answers a restart's OpJoin, now or once the state is in.
func (h *Host) joinLocked(replica int, m *nats.Msg) {
	switch {
	case h.restore[replica] || h.stash[replica] != nil || !h.due[replica]:
		h.answerJoinLocked(replica, m)
	case h.members == 0:
		m.Respond(errAnswer(fmt.Sprintf("stage %q replica %d restarted, and no member of its group is left to take the state from", h.stage, replica)))
	default:
		h.joiner[replica] = m
	}
}

// answerJoinLocked answers a restart's OpJoin: 0 ok; then 0 (nothing to
// take), 1 (the state, of the length that follows as a uint32) or 2
// (restore the save of the step that follows, an int32; -1: none yet);
// then the items the restart drops if they come back, one a line: their
// gradient is in the state it takes. A line is the item's id, and, where
// the group saves and no save holds it yet, a tab and the round it was
// trained in: the restart settles it only once a save holds that round.
func (h *Host) answerJoinLocked(replica int, m *nats.Msg) {
	ans := make([]byte, 6)
	skip := h.trained[replica]
	saved := h.durable // the items of rounds up to here are in a save
	switch st := h.stash[replica]; {
	case h.restore[replica]:
		h.restore[replica] = false
		ans[1] = 2
		binary.LittleEndian.PutUint32(ans[2:], uint32(int32(h.saveStep)))
		// Every member's items: on a shared queue an item one member
		// trained comes back to whichever restart takes it.
		skip = nil
		for _, items := range h.trained {
			skip = append(skip, items...)
		}
		skip = slices.DeleteFunc(skip, func(t group.TrainedItem) bool { return t.Round > h.durable })
	case st != nil:
		ans[1] = 1
		binary.LittleEndian.PutUint32(ans[2:], uint32(len(st)))
	}
	if h.final {
		saved = h.round
	}
	for i, t := range skip {
		if i > 0 {
			ans = append(ans, '\n')
		}
		ans = append(ans, t.ID...)
		if h.saves && t.Round > saved {
			ans = append(append(ans, '\t'), strconv.FormatUint(uint64(t.Round), 10)...)
		}
	}
	h.respondLocked(m, ans)
}

// stateFetchLocked answers a part of the state stashed for a restart; the
// stash goes with its last byte.
func (h *Host) stateFetchLocked(replica int, m *nats.Msg) {
	if len(m.Data) < 13 {
		m.Respond(errAnswer("malformed state fetch"))
		return
	}
	off, n := int(binary.LittleEndian.Uint32(m.Data[5:])), int(binary.LittleEndian.Uint32(m.Data[9:]))
	st := h.stash[replica]
	if off+n > len(st) {
		m.Respond(errAnswer(fmt.Sprintf("stage %q: no state for member %d at %d+%d", h.stage, replica, off, n)))
		return
	}
	m.Respond(append([]byte{0}, st[off:off+n]...))
	if off+n == len(st) {
		delete(h.stash, replica)
	}
}

// leaveLocked takes replica out and reports whether it was the last
// member present (false when it had left already).
func (h *Host) leaveLocked(replica int) (last bool) {
	if h.left[replica] {
		return false
	}
	h.left[replica] = true
	h.members--
	h.dropLocked(replica)
	for to, d := range h.donor {
		if d == replica { // it was sending a state, and failed: another member will
			h.donor[to] = -1
			delete(h.incoming, to)
		}
	}
	h.completeLocked()
	if h.members == 0 {
		h.lastMember = replica
		// Joins waiting for a state no member is left to give: a slot
		// takes none (nothing is left to train), a restart cannot go on.
		for r, j := range h.joiner {
			delete(h.joiner, r)
			h.donor[r] = -1
			if h.slot[r] {
				h.due[r], h.slot[r] = false, false
				h.answerJoinLocked(r, j)
				continue
			}
			j.Respond(errAnswer(fmt.Sprintf("stage %q replica %d restarted, and its group's members finished before it could take the state over", h.stage, r)))
		}
	}
	return h.members == 0
}

// doneLocked takes a returned member's OpDone: answered 0 then 1 once the
// group's final save holds what every member trained, which the last
// member's return says (it wrote the save before). Until then the
// member's inputs stay unsettled, and the request waits.
func (h *Host) doneLocked(replica int, m *nats.Msg) {
	if !h.final && replica == h.lastMember && h.members == 0 {
		h.final = true
		for r, w := range h.done {
			delete(h.done, r)
			h.respondLocked(w, []byte{0, 1})
		}
	}
	if h.final || !h.saves {
		h.respondLocked(m, []byte{0, 1})
		return
	}
	h.done[replica] = m
}

// LeftLost records a member on share, counted lost, that is not
// restarted: one that had finished, or that a move took away (before its
// leave came, mid-step: its arrival is dropped). The share is gone, and
// the member has left, if its leave never came (a failed Leave is not
// the replica's error), so that no round waits for it.
func (h *Host) LeftLost(replica int, share string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leftLostLocked(replica, share)
}

func (h *Host) leftLostLocked(replica int, share string) {
	h.gone[share] = true
	h.orphans = append(h.orphans, h.trained[replica]...)
	delete(h.done, replica) // its worker is gone: nobody to answer
	h.leaveLocked(replica)
}

// dropLocked takes what replica sent for the round under way out of it.
func (h *Host) dropLocked(replica int) {
	delete(h.partial, replica) // a vector it did not finish adds nothing
	delete(h.vecs, replica)
	if i := slices.Index(h.arrived, replica); i >= 0 {
		h.arrived = slices.Delete(h.arrived, i, i+1)
		delete(h.waiting, replica)  // gone, or gave up: nobody waits for the answer
		h.answerAsksLocked(replica) // what it had in hand is not trained
	}
	if len(h.arrived) == 0 && len(h.partial) == 0 {
		h.open = false // nothing of the round is left
	}
}

// lose takes out a replica lost with share, the instance that ran it,
// and refuses what that share asks from now on. Its arrival in the round
// under way is dropped; where the state moves it is due, for its restart.
// It reports how many members are left present.
func (h *Host) Lose(replica int, share string) (present int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone[share] = true
	h.orphans = append(h.orphans, h.trained[replica]...)
	delete(h.joiner, replica)
	delete(h.stash, replica)
	delete(h.incoming, replica)
	delete(h.done, replica)
	h.donor[replica] = -1
	for to, d := range h.donor {
		if d == replica { // it was sending a state: another member will
			h.donor[to] = -1
			delete(h.incoming, to)
		}
	}
	switch {
	case h.restore[replica]:
		// it was to restore the last save: so does its next restart
	case !h.left[replica]:
		h.left[replica] = true
		h.members--
		h.due[replica] = true
		h.dropLocked(replica)
		h.completeLocked()
	}
	if h.members == 0 && h.restorable() && h.stateLostLocked() {
		h.restoreLocked()
	}
	return h.members
}

// restorable reports whether a group with no member left restores its
// last save: it saves, and its final save is not written yet (after it,
// nothing is left to train). h.mu held.
func (h *Host) restorable() bool { return h.keeps && h.saves && !h.final }

// stateLostLocked reports whether the group's state is gone, no member
// being present: none left the group last (a member present was lost),
// or the one that did, which holds the state until its final save, was
// lost before it returned. h.mu held.
func (h *Host) stateLostLocked() bool {
	return h.lastMember < 0 || h.gone[h.share[h.lastMember]]
}

// restoreLocked makes the members of a group lost whole present again,
// to restore the last save at their restart's OpJoin: every due member,
// and every member that had finished after the save (what it trained
// since waits for the final save, unsettled): the rounds after the save
// are trained again by the restarts, all of them present from their
// first step, and what they trained before it is dropped. A member that
// finished before the save stays finished: the save holds all it
// trained; but not the last member to leave, lost before its return:
// its restart restores the save too (even one at its last round), so
// that it is the last again at its Finish and writes the final save,
// which the others' OpDone waits for. A finished member's share still
// counted live is evicted: its restart restores too. A member a move took
// away is not brought back: its share is evicted where it trained after
// the save (what it trained since comes back, and is trained again), and
// its OpDone waits for the final save as a finished member's does.
func (h *Host) restoreLocked() {
	for i := range h.due {
		switch {
		case h.moved[i]:
			// A move took it away: it does not come back. What it
			// trained after the save comes back to the restored members
			// (its share is counted lost, and restarts without it),
			// who train it again; its OpDone is answered at the final
			// save, unless its share is gone.
			h.due[i] = false
			sh := h.share[i]
			if h.lastRound[i] > h.durable && !h.gone[sh] {
				h.evict = append(h.evict, Eviction{Member: i, Share: sh, Moved: true})
				h.gone[sh] = true
			}
			if h.gone[sh] {
				delete(h.done, i)
			}
			h.trained[i] = slices.DeleteFunc(h.trained[i], func(t group.TrainedItem) bool { return t.Round > h.durable })
			continue
		case h.due[i]:
		case h.left[i] && (h.lastRound[i] > h.durable || i == h.lastMember && h.gone[h.share[i]]):
			sh := h.share[i]
			if !h.gone[sh] || slices.ContainsFunc(h.evict, func(e Eviction) bool { return e.Share == sh }) {
				h.evict = append(h.evict, Eviction{Member: i, Share: sh})
				h.gone[sh] = true // what it asks from now on is refused
			}
			delete(h.done, i) // its restart asks again
		default:
			continue
		}
		h.due[i], h.left[i], h.restore[i], h.donor[i] = false, false, true, -1
		h.members++
		h.trained[i] = slices.DeleteFunc(h.trained[i], func(t group.TrainedItem) bool { return t.Round > h.durable })
	}
	h.lastMember = -1
	h.orphans = slices.DeleteFunc(h.orphans, func(t group.TrainedItem) bool { return t.Round > h.durable }) // trained again
	clear(h.incoming)
	clear(h.stash)
	for r, j := range h.joiner {
		delete(h.joiner, r)
		h.answerJoinLocked(r, j)
	}
}

// RestoreWhole restores the group's last save whole, for a group that
// cannot go on without any of its members (nodes.Spec.Whole): every
// member still present, or joined since a restore began, is counted out
// (the coordinator stops its share), and every member restores. False:
// the group cannot restore (it saves nothing, or its final save is
// written).
func (h *Host) RestoreWhole() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.restorable() {
		return false
	}
	for i := range h.due {
		if !h.restore[i] && !h.left[i] {
			h.left[i] = true
			h.members--
			h.due[i] = true
			h.dropLocked(i)
		}
	}
	h.restoreLocked()
	return true
}

// Eviction is a finished member that a group's restore needs back (or
// whose items it needs back: Moved), and the share it ran on, counted
// live until then.
type Eviction struct {
	Member int
	Share  string
	// Moved: a move took the member away; its share restarts without
	// it, and what it trained after the save comes back
	Moved bool
}

// evictions returns, once, the finished members a restore needs back,
// with the shares to count lost for them.
func (h *Host) Evictions() []Eviction {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.evict
	h.evict = nil
	return e
}

// restoring reports whether replica waits to restore the last save.
func (h *Host) Restoring(replica int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.restore[replica]
}

// saveSaid names the save a group lost whole restores.
func (h *Host) SaveSaid() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return StepSaid(h.saveStep)
}

// saveSaid names the save of step (-1: none) a group lost whole restores.
func StepSaid(step int) string {
	if step < 0 {
		return "none yet: it starts again, and everything it trained on comes back"
	}
	return fmt.Sprintf("step %d; what it trained on since comes back", step)
}

// why says why a group with no member left cannot go on.
func (h *Host) Why() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.keeps && h.saves:
		return "and its members had finished before the lost member's restart could take it"
	case h.keeps:
		return "and it saves nothing to restore (a checkpoint, for a kind that writes one)"
	}
	return ""
}

// anyDue reports whether a lost member waits for the group's state.
func (h *Host) AnyDue() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.due, true)
}

func (h *Host) completeLocked() {
	if len(h.arrived) == 0 || len(h.arrived) < h.members {
		return
	}
	var ans []byte
	if h.err != "" {
		ans = errAnswer(h.err)
	} else {
		h.round++
		n := 0
		if h.reduce {
			n = len(h.arrived)
		}
		h.last = sumOf(h.vecs, h.arrived, h.total)
		ans = h.roundAnswerLocked(arrival{round: h.round, n: n, reduce: h.reduce})
		for _, r := range h.arrived {
			h.trainedLocked(r)
			h.lastRound[r] = h.round
			h.answered[r] = arrival{id: h.waiting[r].Header.Get(group.HdrArrival), round: h.round, n: n, reduce: h.reduce}
		}
	}
	for _, r := range h.arrived {
		h.respondLocked(h.waiting[r], ans)
	}
	arrived := slices.Clone(h.arrived)
	h.arrived, h.open = h.arrived[:0], false
	clear(h.waiting)
	clear(h.vecs)
	for _, r := range arrived {
		h.answerAsksLocked(r)
	}
}

// sumOf sums the members' vectors, in arrival order.
func sumOf(vecs map[int][]float32, order []int, n int) []float32 {
	sum := make([]float64, n)
	for _, r := range order {
		for i, v := range vecs[r] {
			sum[i] += float64(v)
		}
	}
	out := make([]float32, n)
	for i, v := range sum {
		out[i] = float32(v)
	}
	return out
}

// arrival is a member's arrival that completed a round: its id (the
// member's, one per collective call), the round, its contributors, and
// whether it was an all-reduce.
type arrival struct {
	id     string
	round  uint32
	n      int
	reduce bool
}

// roundAnswerLocked is the answer of a's round: 0, the contributors and
// the round as uint32s, then the sum where it fits in the answer (the
// member fetches it in parts where not: OpFetch). The sum is that of the
// round completed last (h.last): an all-reduce of an earlier round,
// whose sum is gone, is answered an error.
func (h *Host) roundAnswerLocked(a arrival) []byte {
	if a.reduce && a.round != h.round {
		return errAnswer(fmt.Sprintf("stage %q: round %d completed, and its sum is gone (round %d completed since)", h.stage, a.round, h.round))
	}
	ans := make([]byte, 9, 9+4*len(h.last))
	binary.LittleEndian.PutUint32(ans[1:], uint32(a.n))
	binary.LittleEndian.PutUint32(ans[5:], a.round)
	if a.reduce && len(h.last) <= h.maxAnswer {
		ans = ans[:9+4*len(h.last)]
		group.Encode(ans[9:], h.last)
	}
	return ans
}

// withdrawLocked answers a member's OpWithdraw: its collective ended
// before its answer came, on its context or on a failure (a donation
// that failed, a request that failed). Its arrival in the round under way
// (or the parts of its vector) is taken out, its vector with it: the
// round completes once every member present is waiting in it, with the
// sum of theirs, and waits for this member to come again or leave
// (answered 0). Before, the arrival stayed: the others arrived, the round
// completed with the vector of a member that never took the step, and
// that member, a step behind, could be the last to leave, which saves.
// Where the arrival named (its id after the replica) completed a round,
// that round counts for the member as for the others: the answer is the
// round's. Else (its arrival never came, or its leave or loss took it
// out) 0. A state the member was sending when it gave up will not come:
// another member is asked for it.
func (h *Host) withdrawLocked(replica int, m *nats.Msg) {
	for to, d := range h.donor {
		if d == replica {
			h.donor[to] = -1
			delete(h.incoming, to)
		}
	}
	if slices.Contains(h.arrived, replica) || h.partial[replica] != nil {
		h.dropLocked(replica)
		h.respondLocked(m, []byte{0})
		return
	}
	if a := h.answered[replica]; a.id != "" && a.id == string(m.Data[5:]) {
		h.respondLocked(m, h.roundAnswerLocked(a))
		return
	}
	h.respondLocked(m, []byte{0})
}

// trainedLocked records the item member r had in hand in the round just
// completed: an item in hand over several rounds is the last's.
func (h *Host) trainedLocked(r int) {
	held := h.held[r]
	if held == "" {
		return
	}
	items := h.trained[r]
	if !h.saves {
		items = items[:0] // settled before its next round
	}
	// the ids the member took since its last step, comma separated (a
	// step of k items)
	for id := range strings.SplitSeq(held, ",") {
		if len(items) > 0 && items[len(items)-1].ID == id {
			items[len(items)-1].Round = h.round
		} else {
			items = append(items, group.TrainedItem{Round: h.round, ID: id})
		}
	}
	h.trained[r] = items
}

// Keeps says whether the members' state moves to a restart (Spec.Moves).
func (h *Host) Keeps() bool { return h.keeps }

// SaveStep is the step of the group's last save (-1: none yet).
func (h *Host) SaveStep() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.saveStep
}

// Round is the round in progress: it moves while the group does.
func (h *Host) Round() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.round
}

// WaitingFor says, of a round in progress, whether member i has arrived
// and which present members it waits for.
func (h *Host) WaitingFor(i int) (on []int, arrived, members int, in bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	here := make([]bool, len(h.left))
	for _, m := range h.waiting {
		if len(m.Data) >= 5 {
			if j := int(binary.LittleEndian.Uint32(m.Data[1:5])); j < len(here) {
				here[j] = true
			}
		}
	}
	if i >= len(here) || !here[i] {
		return nil, 0, 0, false
	}
	for j, left := range h.left {
		if !left && !here[j] {
			on = append(on, j)
		}
	}
	return on, len(h.waiting), h.members, true
}
