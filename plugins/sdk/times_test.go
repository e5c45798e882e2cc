package sdk

import (
	"testing"
	"time"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// fakeTimes is a times on a clock the test moves.
type fakeTimes struct {
	times
	at int64
}

func newFakeTimes(source bool) *fakeTimes {
	f := &fakeTimes{}
	f.clock = func() int64 { return f.at }
	f.init(true, source)
	return f
}

// say is the Times said now, at ns.
func (f *fakeTimes) say(t *testing.T, at int64) *proto.Times {
	t.Helper()
	f.at = at
	m := f.message(true).GetTimes()
	if m == nil {
		t.Fatal("no Times")
	}
	return m
}

// TestTimesOverlappingWaits: waits that overlap (a node that Recvs on one
// goroutine and Sends on another, or Sends from two) count each instant
// once, blocked while any Send waits, else idle while any Recv waits, so
// busy + idle + blocked is the wall time and an item's service time is
// the busy time between its Recv and the next. Counted per wait, a Recv
// waiting 0-30 and a Send waiting 10-50 made 30 idle and 40 blocked of
// 50, the busy time clamped to 0, and the item's service time 0.
func TestTimesOverlappingWaits(t *testing.T) {
	f := newFakeTimes(false)
	// Goroutine A: Recv at 0 waits until 30 (the item comes), then works.
	f.at = 0
	f.next()
	endRecv := f.wait(waitIdle)
	// Goroutine B: Send at 10 waits until 50.
	f.at = 10
	endSend := f.wait(waitBlocked)
	// While both wait (10-30), the node is blocked.
	if m := f.say(t, 20); m.IdleNs != 10 || m.BlockedNs != 10 || m.BusyNs != 0 || m.Now != proto.Activity_ACTIVITY_BLOCKED {
		t.Errorf("at 20: busy %d idle %d blocked %d now %v, want 0, 10, 10, blocked", m.BusyNs, m.IdleNs, m.BlockedNs, m.Now)
	}
	f.at = 30
	endRecv()
	f.at = 50
	endSend()
	// A second Send, from each goroutine, 55-70 and 60-80: blocked 25, not 35.
	f.at = 55
	end1 := f.wait(waitBlocked)
	f.at = 60
	end2 := f.wait(waitBlocked)
	f.at = 70
	end1()
	f.at = 80
	end2()
	// A's next Recv at 100 ends the item: 100 less 10 idle and 65 blocked.
	f.at = 100
	f.next()
	m := f.say(t, 120)
	if m.IdleNs != 10 || m.BlockedNs != 65 || m.BusyNs != 45 {
		t.Errorf("busy %d idle %d blocked %d, want 45, 10, 65 (120 in all)", m.BusyNs, m.IdleNs, m.BlockedNs)
	}
	if m.BusyNs+m.IdleNs+m.BlockedNs != 120 {
		t.Errorf("busy+idle+blocked %d, want the wall time, 120", m.BusyNs+m.IdleNs+m.BlockedNs)
	}
	if m.ServiceNs != 25 || len(m.Service) != 1 || m.Service[0].Count != 1 {
		t.Errorf("service %d ns in %v, want one item of 25 ns", m.ServiceNs, m.Service)
	}
	if m.Now != proto.Activity_ACTIVITY_BUSY {
		t.Errorf("now %v, want busy", m.Now)
	}
}

// TestTimesWaitInProgress: a wait in progress counts up to the Times that
// says it, once however many overlap; idle while only Recvs wait.
func TestTimesWaitInProgress(t *testing.T) {
	f := newFakeTimes(false)
	f.at = 5
	end1 := f.wait(waitIdle) // two Recvs, on two ports, from two goroutines
	f.at = 15
	end2 := f.wait(waitIdle)
	m := f.say(t, 25)
	if m.IdleNs != 20 || m.BlockedNs != 0 || m.BusyNs != 5 || m.Now != proto.Activity_ACTIVITY_IDLE {
		t.Errorf("at 25: busy %d idle %d blocked %d now %v, want 5, 20, 0, idle", m.BusyNs, m.IdleNs, m.BlockedNs, m.Now)
	}
	f.at = 30
	end1()
	end2()
	if m := f.say(t, 40); m.IdleNs != 25 || m.BusyNs != 15 {
		t.Errorf("at 40: busy %d idle %d, want 15, 25", m.BusyNs, m.IdleNs)
	}
}

// TestTimesClock: without a test's clock, times counts from its start on
// the wall clock, and a source's items run from one Send to the next.
func TestTimesClock(t *testing.T) {
	var tm times
	tm.init(true, true)
	time.Sleep(time.Millisecond)
	tm.next()
	m := tm.message(true).GetTimes()
	if m.ServiceNs < int64(time.Millisecond) || m.BusyNs < m.ServiceNs || m.IdleNs+m.BlockedNs != 0 {
		t.Errorf("busy %d idle %d blocked %d service %d: want a busy item of 1ms or more", m.BusyNs, m.IdleNs, m.BlockedNs, m.ServiceNs)
	}
}
