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
// Recv that returned it to the node's next Recv (a source's: from one
// Send to the next), less the node's waits meanwhile.
//
// Only calls that block time their waits; a Recv (or a source's Send)
// that does not wait reads the clock once, under the lock, uncontended,
// to end the item in hand and begin the next. The sender says Times every
// timesEvery while anything changed, and once more before Done.
type times struct {
	on    bool
	begin time.Time // the session's start: the clock below counts from it

	mu            sync.Mutex
	idle, blocked int64 // ns in the waits that have ended
	// waits in progress, which may overlap (a node may Recv and Send from
	// two goroutines): how many, and the sum of their starts
	nIdle, nBlocked           int
	idleStarts, blockedStarts int64
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
	t.service = map[int32]int64{}
	if source {
		t.item = 0
	}
}

func (t *times) now() int64 { return int64(time.Since(t.begin)) }

// waitedLocked is the waits' total as of now, those in progress counted
// up to now.
func (t *times) waitedLocked(now int64) int64 {
	return t.idle + t.blocked + int64(t.nIdle+t.nBlocked)*now - t.idleStarts - t.blockedStarts
}

// next ends the item in hand, if any, and begins the next one, at the
// same time: a call that delimits items (each Recv, a source's Send)
// begins. The call's waits are subtracted from the next item's time as
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
	start := t.now()
	if kind == waitIdle {
		t.nIdle++
		t.idleStarts += start
	} else {
		t.nBlocked++
		t.blockedStarts += start
	}
	t.changed = true
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		d := t.now() - start
		if kind == waitIdle {
			t.nIdle--
			t.idleStarts -= start
			t.idle += d
		} else {
			t.nBlocked--
			t.blockedStarts -= start
			t.blocked += d
		}
		t.changed = true
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
	idle := t.idle + int64(t.nIdle)*now - t.idleStarts
	blocked := t.blocked + int64(t.nBlocked)*now - t.blockedStarts
	m := &proto.Times{BusyNs: max(now-idle-blocked, 0), IdleNs: idle, BlockedNs: blocked, ServiceNs: t.serviceSum}
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
