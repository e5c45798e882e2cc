package main

import (
	"hash/crc32"
	"testing"

	"github.com/dflow-dev/dflow/plugins/sdk/sdktest"
)

// TestCRCInProcess tests the node the way a plugin author would: in
// process, through the real runtime, with sdktest.RunNode.
func TestCRCInProcess(t *testing.T) {
	inputs := []any{[]byte("hello"), []byte("dflow"), []byte("")}
	res, err := sdktest.RunNode(Kind, nil, 1, inputs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outputs["out"]) != 3 {
		t.Fatalf("%d items out", len(res.Outputs["out"]))
	}
	want := crc32.ChecksumIEEE([]byte("hello")) ^ crc32.ChecksumIEEE([]byte("dflow")) ^ crc32.ChecksumIEEE(nil)
	if res.Metrics["crc_items"] != 3 || res.Metrics["crc_bytes"] != 10 || uint32(res.Metrics["crc_xor"]) != want {
		t.Errorf("metrics %v, want crc_xor %d", res.Metrics, want)
	}
	if _, err := sdktest.RunNode(Kind, map[string]any{"crash_after": -1}, 1, nil); err == nil {
		t.Error("crash_after -1: want a config error")
	}
}
