package sdk

import (
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// Times (Start.times): the plugin measures where its node's time goes
// and tells dflow, which shows it as the replica's busy, idle and blocked
// time and its service times: seen from dflow's side of the stream, a
// node that computes while it holds credit for more input looks as if it
// waited. Idle is the time the node's Recvs waited for an item, blocked
// the time its Sends waited for dflow's credit or for room in outq, busy
// the rest of the session; an item's service time is the time from the
// Recv that returned it to the node's next Recv on any port (a source's:
// from one Send to the next), less the node's waits meanwhile.
//
// Waits may overlap: a node may Recv and Send from two goroutines, or
// Send from several. Each instant of the session counts once, towards
// one of the three: blocked while any Send waits, else idle while any
// Recv waits, else busy; so busy + idle + blocked is the session's wall
// time, and an item's service time is the busy time between its Recv and
// the next. An instant when both kinds wait is blocked, as Times.now says
// then, and as a built-in stage's state: the node holds an output it
// cannot pass on, so more input would not make it go faster; its
// downstream holds it back, which is what the diagnosis should look at.
//
// Only calls that block time their waits; a Recv (or a source's Send)
// that does not wait reads the clock once, under the lock, uncontended,
// to end the item in hand and begin the next. The sender says Times every
// timesEvery while anything changed, and once more before Done.
type times struct {
	on    bool
	begin time.Time // the session's start: the clock below counts from it

	clock func() int64 // ns since begin (a test's own clock)

	mu sync.Mutex
	// the waits in progress, of each kind; what they make the node
	// (blocked, idle or busy) since when; and the idle and blocked time
	// until then
	nIdle, nBlocked int
	since           int64
	idle, blocked   int64
	// the item in hand: when it began, and the waits' total then; item
	// < 0: none
	item, itemWaited int64
	// the items' service times since the last Times
	serviceSum int64
	service    map[int32]int64
	changed    bool // since the last Times
}

// timesEnabled says whether the plugin measures its nodes' times: unless
// DFLOW_PLUGIN_TIMES=off, when dflow measures them from its side of the
// stream, as it does for a plugin that does not say it.
func timesEnabled() bool { return !strings.EqualFold(os.Getenv("DFLOW_PLUGIN_TIMES"), "off") }

// timesEvery is how often the sender says Times while anything changes.
const timesEvery = 100 * time.Millisecond

const (
	waitIdle = iota
	waitBlocked
)

// init starts the clock; a source's first item begins with the session.
func (t *times) init(on, source bool) {
	t.on, t.begin, t.item = on, time.Now(), -1
	if t.clock == nil {
		t.clock = func() int64 { return int64(time.Since(t.begin)) }
	}
	t.service = map[int32]int64{}
	if source {
		t.item = 0
	}
}

func (t *times) now() int64 { return t.clock() }

// totalsLocked is the idle and blocked time as of now: the time since
// the last change counts once, towards blocked while any Send waits,
// else towards idle while any Recv waits.
func (t *times) totalsLocked(now int64) (idle, blocked int64) {
	idle, blocked = t.idle, t.blocked
	switch d := now - t.since; {
	case t.nBlocked > 0:
		blocked += d
	case t.nIdle > 0:
		idle += d
	}
	return idle, blocked
}

// waitedLocked is the time the node waited as of now, overlapping waits
// counted once.
func (t *times) waitedLocked(now int64) int64 {
	idle, blocked := t.totalsLocked(now)
	return idle + blocked
}

// changeLocked adds d to the waits in progress of a kind, now: the time
// since the last change goes to the totals first.
func (t *times) changeLocked(kind, d int, now int64) {
	t.idle, t.blocked = t.totalsLocked(now)
	t.since = now
	if kind == waitIdle {
		t.nIdle += d
	} else {
		t.nBlocked += d
	}
	t.changed = true
}

// next ends the item in hand, if any, and begins the next one, at the
// same time: a call that delimits items (each Recv, on any port; a
// source's Send) begins. A node that takes one item from each of k ports
// for a piece of work so has k items, whose service times add up to its
// busy time, as dflow's built-in stages count them and as
// `dflow sim --from` replays them (one service time per item received).
// The call's waits are subtracted from the next item's time as
// any others are; a Recv that returns no item (the end of input, a
// cancelled context) takes back the one begun (none).
func (t *times) next() {
	if !t.on {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.item >= 0 {
		d := max(now-t.item-(t.waitedLocked(now)-t.itemWaited), 0)
		t.serviceSum += d
		t.service[serviceBucket(time.Duration(d))]++
		t.changed = true
	}
	t.item, t.itemWaited = now, t.waitedLocked(now)
}

// none takes back the item begun: no item came.
func (t *times) none() {
	if !t.on {
		return
	}
	t.mu.Lock()
	t.item = -1
	t.mu.Unlock()
}

// wait begins a wait that blocks, of a kind; the returned func ends it.
func (t *times) wait(kind int) func() {
	if !t.on {
		return func() {}
	}
	t.mu.Lock()
	t.changeLocked(kind, 1, t.now())
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		t.changeLocked(kind, -1, t.now())
		t.mu.Unlock()
	}
}

// message is the Times to say now, nil when nothing changed since the
// last (unless final, the last one, before Done).
func (t *times) message(final bool) *proto.Message {
	if !t.on {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.changed && !final {
		return nil
	}
	now := t.now()
	idle, blocked := t.totalsLocked(now)
	m := &proto.Times{BusyNs: now - idle - blocked, IdleNs: idle, BlockedNs: blocked, ServiceNs: t.serviceSum}
	switch {
	case t.nBlocked > 0:
		m.Now = proto.Activity_ACTIVITY_BLOCKED
	case t.nIdle > 0:
		m.Now = proto.Activity_ACTIVITY_IDLE
	}
	for b, n := range t.service {
		m.Service = append(m.Service, &proto.ServiceBucket{Bucket: b, Count: n})
	}
	clear(t.service)
	t.serviceSum, t.changed = 0, false
	return &proto.Message{Msg: &proto.Message_Times{Times: m}}
}

// sayTimes sends the Times due (from sendItems, and from run before
// Done).
func (s *session) sayTimes(final bool) error {
	if m := s.times.message(final); m != nil {
		return s.send(m)
	}
	return nil
}

// serviceBucket is a service time's bucket (proto.ServiceBucket): 0 under
// 1µs, else floor(18·log2(µs)) + 1.
func serviceBucket(d time.Duration) int32 {
	if d < time.Microsecond {
		return 0
	}
	return int32(min(math.Floor(18*math.Log2(float64(d)/float64(time.Microsecond))), 1<<20)) + 1
}
