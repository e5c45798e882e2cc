package main

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/zclconf/go-cty/cty"
)

// Kind is the crc node kind, exported for in-process tests.
var Kind = nodes.Spec{
	Kind: graph.Kind{
		Name: "crc",
		Doc:  "Passes items through unchanged and publishes a CRC-32 of their payloads.",
		Config: []graph.Field{
			{Name: "crash_after", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "exit the process abruptly after this many items (0: never)"},
		},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{
				{Name: "in", Dir: graph.In, Type: graph.Any, Doc: "items of any type"},
				{Name: "out", Dir: graph.Out, SameAs: "in", Doc: "the same items"},
			}
		},
		Check: func(cfg *graph.Config) []error {
			if cfg.Int("crash_after") < 0 {
				return []error{&graph.FieldError{Field: "crash_after", Err: fmt.Errorf("must be 0 or more")}}
			}
			return nil
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) { return &crc{crashAfter: cfg.Int("crash_after")}, nil },
}

type crc struct{ crashAfter int }

func (c *crc) Run(ctx context.Context, r nodes.Replica) error {
	in, out := r.In("in"), r.Out("out")
	var sum uint32
	for n := 0; ; n++ {
		if c.crashAfter > 0 && n == c.crashAfter {
			fmt.Fprintf(sdk.Stderr, "crc: crashing on purpose after %d items\n", n)
			os.Exit(3)
		}
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		_, payload, err := sdk.Encode(item)
		if err != nil {
			return err
		}
		sum ^= crc32.ChecksumIEEE(payload)
		r.Metrics().Add("crc_items", 1)
		r.Metrics().Add("crc_bytes", float64(len(payload)))
		r.Metrics().Set("crc_xor", float64(sum))
		if err := out.Send(ctx, item); err != nil {
			return err
		}
	}
}

func main() { sdk.Serve(Kind) }
