package host

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// bare serves the protocol as a plugin written from docs/plugin-protocol.md
// alone might (DFLOW_TEST_PLUGIN=bare): the handshake line by hand, the
// Node service and nothing of go-plugin's (no GRPCController, so no
// Shutdown), and it never exits by itself, not at Done nor at the end
// of its lifeline.
func bare() {
	dir := os.Getenv("PLUGIN_UNIX_SOCKET_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("bare-%d", os.Getpid()))
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := grpc.NewServer()
	proto.RegisterNodeServer(s, bareNode{})
	fmt.Printf("1|1|unix|%s|grpc|\n", path)
	s.Serve(l)
}

// bareNode has one kind, drop: it takes its input "in" and sends nothing.
type bareNode struct{ proto.UnimplementedNodeServer }

func (bareNode) Describe(context.Context, *proto.DescribeRequest) (*proto.DescribeResponse, error) {
	return &proto.DescribeResponse{PortCredit: true, Kinds: []*proto.Kind{{Name: "drop"}}}, nil
}

func (bareNode) Check(context.Context, *proto.CheckRequest) (*proto.CheckResponse, error) {
	return &proto.CheckResponse{Ports: []*proto.Port{{Name: "in", Type: "blob"}}}, nil
}

func (bareNode) Run(st proto.Node_RunServer) error {
	if _, err := st.Recv(); err != nil { // Start
		return err
	}
	if err := st.Send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{Port: "in", N: 1 << 30}}}); err != nil {
		return err
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		if m.GetEof() != nil {
			return st.Send(&proto.Message{Msg: &proto.Message_Done{Done: &proto.Done{}}})
		}
	}
}

// TestBarePluginEndsAtOnce: a replica of a plugin that neither serves
// go-plugin's Shutdown nor exits after Done ends as soon as it said
// Done: dflow kills it, without go-plugin's wait of 2 s for a graceful
// exit (which it logs, "plugin failed to exit gracefully", when it runs
// out). Each of a 2000-item run's replicas paid those 2 s before.
func TestBarePluginEndsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var log syncBuf
	f.h.logger = hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Warn})
	if _, err := f.h.Load("bare", wrapper(t, f.dir, "bare", "bare"), f.reg); err != nil {
		t.Fatal(err)
	}
	_, err := f.run(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 50
  }
}
stage "d" {
  node     = "bare/drop"
  replicas = 3
}
edge "a" {
  from = src.out
  to   = d.in
}`)
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr.String())
	}
	f.h.Close() // the catalog process too
	if strings.Contains(log.String(), "failed to exit gracefully") {
		t.Errorf("go-plugin waited for a graceful exit:\n%s", log.String())
	}
}

// TestSocketFoldersSwept: go-plugin's socket folders go in a folder of
// the host's, dflow-plugins-PID-*, which Close removes; a SIGKILLed dflow
// leaves its folder behind, and the next host to start a plugin removes
// it (and any other whose process is gone), not one whose process lives.
func TestSocketFoldersSwept(t *testing.T) {
	t.Parallel()
	tmp, err := os.MkdirTemp("", "sw") // short: a socket's path is bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	path := wrapper(t, t.TempDir(), "tp", "serve")
	dflow := exec.Command(self(t), "-test.run=^$")
	dflow.Env = append(os.Environ(), "DFLOW_TEST_PLUGIN=dflow", "DFLOW_TEST_PLUGIN_PATH="+path, "TMPDIR="+tmp)
	plugintest.KillDflow(t, dflow, path, 3)
	left, _ := filepath.Glob(filepath.Join(tmp, socketPrefix+"*", "plugin-dir*"))
	if len(left) == 0 {
		t.Fatalf("the killed dflow left no socket folder in %s (its plugins' sockets went elsewhere?)", tmp)
	}
	live := filepath.Join(tmp, fmt.Sprintf("%s%d-x", socketPrefix, os.Getppid())) // a process that lives
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}

	f := newFixture(t)
	f.h.tempDir = tmp
	if _, err := f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg); err != nil {
		t.Fatal(err)
	}
	for _, dir := range left {
		if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
			t.Errorf("the killed dflow's %s is still there (%v)", filepath.Dir(dir), err)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the folder of a live process was swept: %v", err)
	}
	mine, _ := filepath.Glob(filepath.Join(tmp, fmt.Sprintf("%s%d-*", socketPrefix, os.Getpid()), "plugin-dir*"))
	if len(mine) != 1 {
		t.Errorf("socket folders of this host's catalog process: %v, want one", mine)
	}
	f.h.Close()
	if mine, _ := filepath.Glob(filepath.Join(tmp, fmt.Sprintf("%s%d-*", socketPrefix, os.Getpid()))); len(mine) != 0 {
		t.Errorf("Close left %v", mine)
	}
}
