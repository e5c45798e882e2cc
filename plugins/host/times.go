package host

import (
	"errors"
	"math"
	"os"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// ownClock is the runtime's Replica (internal/engine's) taking a node's
// own account of where the replica's time goes, in place of what it
// measures at the replica's ports: a plugin replica's ports wait for the
// plugin's credit and for its items, which says little of what its node
// does meanwhile (one that computes while it holds credit for more input
// looked blocked or idle as it worked). A plugin that says
// DescribeResponse.times measures it and sends Times (docs/plugins.md,
// "Busy, idle and blocked").
type ownClock interface {
	// OwnTimes: idle and blocked so far, and whether the node waits now
	// (the time until the next call counts towards that wait, or busy).
	OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool)
	// OwnService adds items' service times: their sum, and how many took
	// about how long.
	OwnService(sum time.Duration, counts map[time.Duration]int64)
}

// pluginClock is a replica's ownClock when its plugin measures its times
// (nil otherwise: the replica is measured at its ports).
type pluginClock struct{ c ownClock }

// DFLOW_PLUGIN_TIMES=off, which the SDKs obey too, keeps every replica
// measured at its ports.
func ownClockOf(r nodes.Replica, times bool) *pluginClock {
	if c, ok := r.(ownClock); ok && times && !strings.EqualFold(os.Getenv("DFLOW_PLUGIN_TIMES"), "off") {
		return &pluginClock{c}
	}
	return nil
}

// begin makes the plugin's figures the replica's from now on, nothing
// waited yet, before Start asks the plugin for them; it reports whether
// Start is to ask (Start.times).
func (p *pluginClock) begin() bool {
	if p == nil {
		return false
	}
	p.c.OwnTimes(0, 0, false, false)
	return true
}

// take takes a Times from the plugin.
func (p *pluginClock) take(t *proto.Times) error {
	if p == nil {
		return errors.New("the plugin sent Times, which dflow did not ask for (Start.times)")
	}
	if t.IdleNs < 0 || t.BlockedNs < 0 || t.ServiceNs < 0 {
		return errors.New("the plugin sent Times with a negative time")
	}
	var counts map[time.Duration]int64
	for _, b := range t.Service {
		if b.Bucket < 0 || b.Count < 0 {
			return errors.New("the plugin sent Times with a negative service-time bucket or count")
		}
		if counts == nil {
			counts = map[time.Duration]int64{}
		}
		counts[bucketTime(b.Bucket)] += b.Count
	}
	if counts != nil || t.ServiceNs > 0 {
		p.c.OwnService(time.Duration(t.ServiceNs), counts)
	}
	p.c.OwnTimes(time.Duration(t.IdleNs), time.Duration(t.BlockedNs),
		t.Now == proto.Activity_ACTIVITY_IDLE, t.Now == proto.Activity_ACTIVITY_BLOCKED)
	return nil
}

// bucketTime is a time within a service-time bucket (proto.ServiceBucket),
// in the middle of it on a log scale: 0 for bucket 0 (under 1µs), else
// 2^((b-0.5)/18) µs.
func bucketTime(b int32) time.Duration {
	if b <= 0 {
		return 0
	}
	return time.Duration(float64(time.Microsecond) * math.Exp2(min((float64(b)-0.5)/18, 40)))
}
