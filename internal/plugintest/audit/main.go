// Command audit is a plugin for the cluster audit (cmd/dflow's
// TestAuditBytes, bench/audit): the two ends of a chain, outside dflow's
// own counts. Its kind source makes count items of the item type its
// type config names (bytes or blob), each with a unique id inside its
// payload (the first line: "audit-id N", N from 0); its kind sink appends
// the id of every item it receives to the file its file config names,
// one line each, written as it arrives, so that the file says what
// reached the sink whatever the run's report says. An item without an id
// is written as "bad" and its payload in hex.
//
// Built by the tests and linked as dflow-plugin-audit (docs/plugins.md).
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/zclconf/go-cty/cty"
)

// prefix starts every payload, before the id.
const prefix = "audit-id "

var sourceKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "source",
		Doc:  "Emits count items of type type, each with a unique id in its payload (\"audit-id N\", N from 0).",
		Config: []graph.Field{
			{Name: "count", Type: graph.Int, Required: true, Doc: "how many items"},
			{Name: "type", Type: graph.String, Default: cty.StringVal("bytes"), Doc: "the item type: bytes or blob"},
			{Name: "size_bytes", Type: graph.Int, Default: cty.NumberIntVal(64), Doc: "each payload's size, at least the id's line"},
		},
		Ports: func(cfg *graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: cfg.String("type"), Doc: "the items"}}
		},
		Check: func(cfg *graph.Config) []error {
			if t := cfg.String("type"); t != "bytes" && t != "blob" {
				return []error{&graph.FieldError{Field: "type", Err: fmt.Errorf("must be bytes or blob, not %q", t)}}
			}
			if cfg.Int("count") < 0 {
				return []error{&graph.FieldError{Field: "count", Err: fmt.Errorf("must be 0 or more")}}
			}
			return nil
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) {
		return &source{count: cfg.Int("count"), blob: cfg.String("type") == "blob", size: cfg.Int("size_bytes")}, nil
	},
}

type source struct {
	count, size int
	blob        bool
}

// payload is item id's payload: its id line, then zeros up to size.
func payload(id, size int) []byte {
	b := fmt.Appendf(nil, "%s%d\n", prefix, id)
	if len(b) < size {
		b = append(b, make([]byte, size-len(b))...)
	}
	return b
}

func (s *source) Run(ctx context.Context, r nodes.Replica) error {
	out := r.Out("out")
	// Replica i of n emits the ids i, i+n, i+2n, ...: unique over them.
	for id := r.Index(); id < s.count; id += r.Replicas() {
		var item any = payload(id, s.size)
		if s.blob {
			item = &items.Blob{Replica: r.Index(), Seq: int64(id), Data: item.([]byte)}
		}
		if err := out.Send(ctx, item); err != nil {
			return err
		}
	}
	return nil
}

var sinkKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "sink",
		Doc:  "Appends the id in each item's payload to file, one line each, as it arrives.",
		Config: []graph.Field{
			{Name: "file", Type: graph.String, Required: true, Path: graph.WritePath, Doc: "the file the ids are appended to"},
		},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any, Doc: "bytes or blob items from source"}}
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) { return &sink{file: cfg.String("file")}, nil },
}

type sink struct{ file string }

func (s *sink) Run(ctx context.Context, r nodes.Replica) error {
	f, err := os.OpenFile(s.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	in := r.In("in")
	for {
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return f.Close()
		}
		if err != nil {
			return err
		}
		// One write a line, unbuffered: what arrived is in the file even
		// if this process is killed.
		if _, err := f.Write(line(item)); err != nil {
			return err
		}
	}
}

// line is what the sink writes for item: its id, or "bad" and what it was.
func line(item any) []byte {
	var data []byte
	switch it := item.(type) {
	case []byte:
		data = it
	case *items.Blob:
		data = it.Data
	default:
		return fmt.Appendf(nil, "bad %T\n", item)
	}
	if rest, ok := bytes.CutPrefix(data, []byte(prefix)); ok {
		if n := bytes.IndexByte(rest, '\n'); n > 0 {
			if id, err := strconv.Atoi(string(rest[:n])); err == nil {
				return fmt.Appendf(nil, "%d\n", id)
			}
		}
	}
	return fmt.Appendf(nil, "bad %s\n", hex.EncodeToString(data[:min(len(data), 32)]))
}

func main() { sdk.Serve(sourceKind, sinkKind) }
