package monitor

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMonitoring moves b.N items from 5 synthetic_source replicas to
// 3 sink replicas (no service time) over a shared edge, with monitoring
// off (no status, no series, no scrapes) and on at an extreme rate (a
// snapshot, a series point and a status line every millisecond, and a
// Prometheus collection every millisecond). One op is one item.
func BenchmarkMonitoring(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			src := fmt.Sprintf(`
stage "p" {
  node     = "synthetic_source"
  replicas = 5
  config {
    count = %d
  }
}
stage "c" {
  node     = "sink"
  replicas = 3
}
edge "e" {
  from = p.out
  to   = c.in
}`, b.N)
			g, diags := (&graph.Loader{Catalog: registry()}).Load("bench.hcl", []byte(src))
			if diags.HasErrors() {
				b.Fatal(diags)
			}
			opts := engine.Options{Registry: registry()}
			if on {
				st := &Status{W: io.Discard}
				opts.Interval, opts.Observe = time.Millisecond, st.Observe
			}
			p, err := engine.New(g, opts)
			if err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			scraped := make(chan struct{})
			go func() {
				defer close(scraped)
				if !on {
					return
				}
				c := NewCollector(p.Snapshot)
				ch := make(chan prometheus.Metric, 1024)
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
						c.Collect(ch)
						for len(ch) > 0 {
							<-ch
						}
					}
				}
			}()
			b.ReportAllocs()
			b.ResetTimer()
			rep, err := p.Execute(context.Background())
			b.StopTimer()
			close(stop)
			<-scraped
			if err != nil || rep.Edges["e"].Consumed != int64(b.N) {
				b.Fatalf("err %v consumed %d", err, rep.Edges["e"].Consumed)
			}
		})
	}
}
