package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/conformance"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/zclconf/go-cty/cty"
)

// TestMain re-runs the test binary as the Go SDK's conformance plugin
// when goPluginEnv says so; otherwise conformance.Main.
func TestMain(m *testing.M) {
	if os.Getenv(goPluginEnv) != "" {
		sdk.Serve(passKind, zipKind, forkKind, groupKind)
		return
	}
	testutil.RaceExitAtOnce()
	conformance.Main(m)
}

const goPluginEnv = "DFLOW_CONFORMANCE_GO_PLUGIN"

// TestGoSDK: the suite against a plugin on the Go SDK (this test binary,
// through a wrapper whose path is on its command line).
func TestGoSDK(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dflow-plugin-goconf")
	body := fmt.Sprintf("#!/bin/sh\n%s=1 exec %q -test.run='^$' \"$0\"\n", goPluginEnv, self)
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, conformance.Plugin{
		Path: path,
		Pass: conformance.Pass{Kind: "pass", Items: "items", Crash: "crash_after",
			CrashLine: "pass: crashing on purpose after 7 items", Slow: "sleep_ms = 1000"},
		Zip:   "zip",
		Fork:  "fork",
		Group: "group",
	})
}

// passKind sends each item on; crash_after exits the process abruptly
// after that many items, sleep_ms is work on each item outside any SDK
// call.
var passKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "pass",
		Config: []graph.Field{
			{Name: "crash_after", Type: graph.Int, Default: cty.NumberIntVal(0)},
			{Name: "sleep_ms", Type: graph.Int, Default: cty.NumberIntVal(0)},
		},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, SameAs: "in"}}
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) {
		crash, sleep := cfg.Int("crash_after"), time.Duration(cfg.Int("sleep_ms"))*time.Millisecond
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			in, out := r.In("in"), r.Out("out")
			for n := 0; ; n++ {
				if crash > 0 && n == crash {
					fmt.Fprintf(sdk.Stderr, "pass: crashing on purpose after %d items\n", n)
					os.Exit(3)
				}
				item, err := in.Recv(ctx)
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if sleep > 0 {
					select {
					case <-time.After(sleep): // the work
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				r.Metrics().Add("items", 1)
				if err := out.Send(ctx, item); err != nil {
					return err
				}
			}
		}), nil
	},
}

// zipKind takes items from its inputs b and a in turn, b first, until
// both end.
var zipKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "zip",
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{
				{Name: "a", Dir: graph.In, Type: graph.Any},
				{Name: "b", Dir: graph.In, Type: graph.Any},
				{Name: "out", Dir: graph.Out, SameAs: "a"},
			}
		},
	},
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			ins := []nodes.Input{r.In("b"), r.In("a")}
			ended := make([]bool, 2)
			for i := 0; !ended[0] || !ended[1]; i = 1 - i {
				if ended[i] {
					continue
				}
				item, err := ins[i].Recv(ctx)
				if err == io.EOF {
					ended[i] = true
					continue
				}
				if err != nil {
					return err
				}
				if err := r.Out("out").Send(ctx, item); err != nil {
					return err
				}
			}
			return nil
		}), nil
	},
}

// forkKind sends count items on each of its outputs a and b, from two
// goroutines.
var forkKind = nodes.Spec{
	Kind: graph.Kind{
		Name:   "fork",
		Config: []graph.Field{{Name: "count", Type: graph.Int, Default: cty.NumberIntVal(0)}},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "a", Dir: graph.Out, Type: "blob"}, {Name: "b", Dir: graph.Out, Type: "blob"}}
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) {
		count := cfg.Int("count")
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for k, port := range []string{"a", "b"} {
				wg.Go(func() {
					out := r.Out(port)
					for i := range count {
						if errs[k] = out.Send(ctx, &items.Blob{Seq: int64(i), Data: []byte(port)}); errs[k] != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			return errors.Join(errs...)
		}), nil
	},
}

// groupKind is a group kind taking its input in steps of one (sdk.Steps)
// and sending each step's items on.
var groupKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "group",
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "blob"}, {Name: "out", Dir: graph.Out, Type: "blob"}}
		},
	},
	Sync: nodes.Always,
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			for st, err := range sdk.Steps(ctx, r, "in", 1) {
				if err != nil {
					return err
				}
				for _, item := range st.Items {
					if err := r.Out("out").Send(ctx, item); err != nil {
						return err
					}
				}
			}
			return nil
		}), nil
	},
}
