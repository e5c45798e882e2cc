package monitor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/engine"
)

// TestRealPrometheus scrapes a live run with Debian's prometheus every
// 500ms, as a user would, and asks it what it saw: no counter ever
// reset (went down between scrapes), and no replica was busy, idle or
// blocked more than all of the time between two scrapes. It skips where
// prometheus is not installed (apt-get install prometheus).
func TestRealPrometheus(t *testing.T) {
	// Not parallel: what it asserts rests on a run's measured busy and
	// idle times, which the package's parallel plots upset (TestDiagnoseSeed
	// failed so beside them).
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (apt-get install prometheus): skipping the real-Prometheus check")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	// A long run, drained once Prometheus has seen enough of it.
	g := load(t, "stage.reader.config.count=1000000")
	drain := make(chan struct{})
	p, err := engine.New(g, engine.Options{Registry: registry(), Drain: drain})
	if err != nil {
		t.Fatal(err)
	}
	metrics, shutdown, err := Serve("127.0.0.1:0", NewCollector(p.Snapshot))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Execute(ctx)
		done <- err
	}()
	defer func() {
		select {
		case <-drain:
		default:
			close(drain)
		}
		<-done
	}()

	u, _ := url.Parse(metrics)
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 500ms\n  evaluation_interval: 10s\nscrape_configs:\n  - job_name: dflow\n    static_configs:\n      - targets: [%q]\n", u.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	web := freeAddr(t)
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web, "--log.level=warn")
	out, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	api := "http://" + web + "/api/v1/query?query="
	query := func(q string) (map[string]float64, error) {
		resp, err := http.Get(api + url.QueryEscape(q))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string
			Error  string
			Data   struct {
				Result []struct {
					Metric map[string]string
					Value  [2]any
				}
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return nil, err
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("%s: %s", q, r.Error)
		}
		got := map[string]float64{}
		for _, s := range r.Data.Result {
			v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
			got[fmt.Sprintf("%s{stage=%s,replica=%s,edge=%s}", s.Metric["__name__"], s.Metric["stage"], s.Metric["replica"], s.Metric["edge"])] = v
		}
		return got, nil
	}
	// Poll (with a deadline) until 12 scrapes, 6 seconds of the run, are in.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for {
		r, err := query("count_over_time(dflow_run_elapsed_seconds[5m])")
		if err == nil && len(r) == 1 {
			if n := firstValue(r); n >= 12 {
				break
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			log, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("prometheus did not scrape 12 times in 60s (%v, %v):\n%s", r, err, log)
		}
	}

	seen := 0
	for _, c := range []string{"dflow_edge_produced_items_total", "dflow_edge_consumed_items_total",
		"dflow_replica_items_in_total", "dflow_replica_items_out_total",
		"dflow_replica_busy_seconds_total", "dflow_replica_idle_seconds_total", "dflow_replica_blocked_seconds_total"} {
		resets, err := query("resets(" + c + "[5m])")
		if err != nil {
			t.Fatal(err)
		}
		seen += len(resets)
		for series, n := range resets {
			if n != 0 {
				t.Errorf("%s %s reset %g times", c, series, n)
			}
		}
	}
	if want := 2*3 + 5*10; seen != want {
		t.Errorf("%d counter series seen, want %d", seen, want)
	}
	for _, m := range []string{"busy", "idle", "blocked"} {
		rates, err := query(fmt.Sprintf("max_over_time(rate(dflow_replica_%s_seconds_total[2s])[5m:500ms])", m))
		if err != nil {
			t.Fatal(err)
		}
		if len(rates) != 10 {
			t.Errorf("%s: %d replicas, want 10: %v", m, len(rates), rates)
		}
		for name, r := range rates {
			if r > 1.05 { // a little over 1 is scrape timestamps' jitter
				t.Errorf("%s: rate up to %.3f: more than all of the time", name, r)
			}
		}
	}
}

func firstValue(m map[string]float64) float64 {
	for _, v := range m {
		return v
	}
	return 0
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
