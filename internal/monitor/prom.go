package monitor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/report"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Collector exposes a running pipeline to Prometheus. It reads one
// snapshot per scrape, so it costs nothing on the per-item path.
type Collector struct {
	snap func() *report.Snapshot
}

// NewCollector returns a collector over snap (Pipeline.Snapshot).
func NewCollector(snap func() *report.Snapshot) *Collector { return &Collector{snap: snap} }

var (
	stageReplica = []string{"stage", "replica"}
	edgeQueue    = []string{"edge", "queue"}

	descElapsed  = prometheus.NewDesc("dflow_run_elapsed_seconds", "Seconds since the run started.", nil, nil)
	descDepth    = prometheus.NewDesc("dflow_queue_depth", "Items waiting in the queue.", edgeQueue, nil)
	descCapacity = prometheus.NewDesc("dflow_queue_capacity", "Bound of the queue in items.", edgeQueue, nil)
	descOpen     = prometheus.NewDesc("dflow_queue_open_producers", "Producer replicas still holding the queue open.", edgeQueue, nil)
	descProduced = prometheus.NewDesc("dflow_edge_produced_items_total", "Items pushed into the edge's queues.", []string{"edge"}, nil)
	descConsumed = prometheus.NewDesc("dflow_edge_consumed_items_total", "Items taken from the edge's queues.", []string{"edge"}, nil)
	descIn       = prometheus.NewDesc("dflow_replica_items_in_total", "Items the replica received.", stageReplica, nil)
	descOut      = prometheus.NewDesc("dflow_replica_items_out_total", "Items the replica sent.", stageReplica, nil)
	descBusy     = prometheus.NewDesc("dflow_replica_busy_seconds_total", "Seconds the replica spent working.", stageReplica, nil)
	descIdle     = prometheus.NewDesc("dflow_replica_idle_seconds_total", "Seconds the replica spent waiting for input.", stageReplica, nil)
	descBlocked  = prometheus.NewDesc("dflow_replica_blocked_seconds_total", "Seconds the replica spent waiting for room downstream or for its siblings.", stageReplica, nil)
	descDone     = prometheus.NewDesc("dflow_replica_done", "1 once the replica has returned.", stageReplica, nil)
	stageLabel   = []string{"stage"}
	descReplicas = prometheus.NewDesc("dflow_stage_replicas", "Replicas the stage has: those started, less those a rebalance moved to another stage.", stageLabel, nil)
	descMoved    = prometheus.NewDesc("dflow_rebalance_moved_replicas_total", "Replicas a rebalance moved from one stage to another (from \"(spare)\": the budget's replicas no stage had).", []string{"from", "to"}, nil)
)

// Describe implements prometheus.Collector. The node metrics' families
// are known only once nodes publish them, so they are not described; the
// registry accepts them as it accepts an unchecked collector's.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descElapsed, descDepth, descCapacity, descOpen, descProduced, descConsumed,
		descIn, descOut, descBusy, descIdle, descBlocked, descDone, descReplicas, descMoved} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(descElapsed, gauge, s.Elapsed.Seconds())
	for _, e := range s.Edges {
		ch <- prometheus.MustNewConstMetric(descProduced, counter, float64(e.Produced), e.Name)
		ch <- prometheus.MustNewConstMetric(descConsumed, counter, float64(e.Consumed), e.Name)
		for i, q := range e.Queues {
			qi := strconv.Itoa(i)
			ch <- prometheus.MustNewConstMetric(descDepth, gauge, float64(q.Depth), e.Name, qi)
			ch <- prometheus.MustNewConstMetric(descCapacity, gauge, float64(e.Capacity), e.Name, qi)
			ch <- prometheus.MustNewConstMetric(descOpen, gauge, float64(len(q.Open)), e.Name, qi)
		}
	}
	for _, st := range s.Stages {
		ch <- prometheus.MustNewConstMetric(descReplicas, gauge, float64(st.Size()), st.Name)
		for i, r := range st.Replicas {
			ri := strconv.Itoa(i)
			ch <- prometheus.MustNewConstMetric(descIn, counter, float64(r.ItemsIn), st.Name, ri)
			ch <- prometheus.MustNewConstMetric(descOut, counter, float64(r.ItemsOut), st.Name, ri)
			ch <- prometheus.MustNewConstMetric(descBusy, counter, r.Busy.Seconds(), st.Name, ri)
			ch <- prometheus.MustNewConstMetric(descIdle, counter, r.Idle.Seconds(), st.Name, ri)
			ch <- prometheus.MustNewConstMetric(descBlocked, counter, r.Blocked.Seconds(), st.Name, ri)
			done := 0.0
			if r.Done {
				done = 1
			}
			ch <- prometheus.MustNewConstMetric(descDone, gauge, done, st.Name, ri)
		}
	}
	c.collectMoves(ch, s)
	c.collectNodeMetrics(ch, s)
}

// collectMoves exports the replicas a rebalance moved so far, per pair of
// stages, in the order the pairs first moved.
func (c *Collector) collectMoves(ch chan<- prometheus.Metric, s *report.Snapshot) {
	type pair struct{ from, to string }
	var order []pair
	moved := map[pair]int{}
	for _, m := range s.Moves {
		p := pair{m.From, m.To}
		if p.from == "" {
			p.from = "(spare)"
		}
		if _, ok := moved[p]; !ok {
			order = append(order, p)
		}
		moved[p] += m.Replicas
	}
	for _, p := range order {
		ch <- prometheus.MustNewConstMetric(descMoved, prometheus.CounterValue, float64(moved[p]), p.from, p.to)
	}
}

// collectNodeMetrics exports each node metric as a family of its own:
// dflow_node_NAME{stage} a gauge for a value set with Metrics().Set,
// dflow_node_NAME_total{stage} a counter for one added to with
// Metrics().Add. A name that would repeat a series already sent (two
// names the same once sanitized, a gauge spelt like a counter) is
// skipped rather than failing the whole scrape.
func (c *Collector) collectNodeMetrics(ch chan<- prometheus.Metric, s *report.Snapshot) {
	type family struct {
		desc    *prometheus.Desc
		counter bool
	}
	families := map[string]family{}
	seen := map[[2]string]bool{} // family, stage
	for _, st := range s.Stages {
		names := make([]string, 0, len(st.Metrics))
		for name := range st.Metrics {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			counter := st.Counters[name]
			fam := NodeMetricName(name, counter)
			f, ok := families[fam]
			if !ok {
				help := fmt.Sprintf("The node metric %q (Metrics().Set: the latest value).", name)
				if counter {
					help = fmt.Sprintf("The node metric %q (Metrics().Add: summed over replicas).", name)
				}
				f = family{prometheus.NewDesc(fam, help, stageLabel, nil), counter}
				families[fam] = f
			}
			if f.counter != counter || seen[[2]string{fam, st.Name}] {
				continue
			}
			seen[[2]string{fam, st.Name}] = true
			typ := prometheus.GaugeValue
			if counter {
				typ = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(f.desc, typ, st.Metrics[name], st.Name)
		}
	}
}

// NodeMetricName is the Prometheus family of a node metric: dflow_node_
// and the name with every character outside [a-zA-Z0-9_] made _, and
// _total after a counter's.
func NodeMetricName(name string, counter bool) string {
	b := []byte("dflow_node_")
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b = append(b, byte(r))
		default:
			b = append(b, '_')
		}
	}
	if counter && !strings.HasSuffix(string(b), "_total") {
		b = append(b, "_total"...)
	}
	return string(b)
}

// LoopbackAddr binds an address with no host ("":9090") to the loopback
// interface, so metrics are not exposed to the network unless asked for
// with an explicit host such as 0.0.0.0.
func LoopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics address %q: want HOST:PORT or :PORT", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// Serve exposes c at http://ADDR/metrics until the returned shutdown is
// called. It returns the URL actually bound (port 0 picks one).
func Serve(addr string, c *Collector) (url string, shutdown func(), err error) {
	addr, err = LoopbackAddr(addr)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln) // returns http.ErrServerClosed on shutdown
	}()
	return "http://" + ln.Addr().String() + "/metrics", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
