package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/internal/netport"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// A group kind (Kind.group, protocol version 2) is a stage whose replicas
// step together, as a data-parallel trainer's ranks do. Each replica is a
// process of its own (as every plugin replica is), started with the
// environment torchrun gives a rank, so that
// torch.distributed.init_process_group(backend, init_method="env://")
// works unchanged, and its collectives (Collective messages) go to the
// stage's replica group in the engine, the one a built-in kind's
// nodes.Group is.

// Place is where a group kind's replica runs, as its torch.distributed
// rank sees it (Host.GroupPlace; nodes.RankPlace).
type Place = nodes.RankPlace

// stageDevices is implemented by the engine's replicas: every replica's
// device, by index.
type stageDevices interface{ Devices() []string }

// place is where replica r of a group stage runs: as the run's context
// says (nodes.RankPlacerFrom: a cluster's worker, the members on several
// hosts), the host's GroupPlace, or, by default, the whole group on this
// host, with one free port for the stage's run (n.master, chosen by the
// first replica to start).
func (n *remoteNode) place(ctx context.Context, r nodes.Replica) (Place, error) {
	if f := nodes.RankPlacerFrom(ctx); f != nil {
		return f(ctx, r)
	}
	if f := n.k.host.GroupPlace; f != nil {
		return f(r)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.master == 0 {
		port, err := netport.Free("127.0.0.1")
		if err != nil {
			return Place{}, fmt.Errorf("a port for the group's rank 0 (MASTER_PORT): %w", err)
		}
		n.master = port
	}
	p := Place{MasterAddr: "127.0.0.1", MasterPort: n.master, LocalRank: r.Index(), LocalWorldSize: r.Replicas()}
	if d, ok := r.(stageDevices); ok {
		p.LocalDevices = d.Devices()
	}
	return p, nil
}

// rankEnv is the environment a group member's process starts with, and
// its device as the process numbers it (Start.device).
//
// The device is bound by CUDA_VISIBLE_DEVICES, before the process starts:
// where the members on the host have distinct CUDA devices, every member
// sees all of them in local-rank order, so that cuda:LOCAL_RANK is its
// own (torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) lands on the
// device the spec names, and NCCL sees its peers' devices); otherwise
// (devices shared or mixed with cpu, or not known) it sees its own only,
// as cuda:0. A member on "cpu" sees none. DFLOW_DEVICE and Start.device
// name its device as the process numbers it, in every case.
func rankEnv(r nodes.Replica, p Place) (env []string, device string) {
	env = []string{
		"RANK=" + strconv.Itoa(r.Index()),
		"WORLD_SIZE=" + strconv.Itoa(r.Replicas()),
		"LOCAL_RANK=" + strconv.Itoa(p.LocalRank),
		"LOCAL_WORLD_SIZE=" + strconv.Itoa(p.LocalWorldSize),
		"MASTER_ADDR=" + p.MasterAddr,
		"MASTER_PORT=" + strconv.Itoa(p.MasterPort),
	}
	own, ok := cudaIndex(r.Device())
	switch {
	case !ok:
		device = "cpu"
		env = append(env, "CUDA_VISIBLE_DEVICES=")
	case distinctCUDA(p.LocalDevices, p.LocalWorldSize):
		var ids []string
		for _, d := range p.LocalDevices {
			i, _ := cudaIndex(d)
			ids = append(ids, physical(i))
		}
		device = "cuda:" + strconv.Itoa(p.LocalRank)
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(ids, ","))
	default:
		device = "cuda:0"
		env = append(env, "CUDA_VISIBLE_DEVICES="+physical(own))
	}
	return append(env, "DFLOW_DEVICE="+device), device
}

// cudaIndex is N of "cuda:N".
func cudaIndex(device string) (int, bool) {
	s, ok := strings.CutPrefix(device, "cuda:")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	return i, err == nil && i >= 0
}

// distinctCUDA says whether devices are n distinct CUDA devices.
func distinctCUDA(devices []string, n int) bool {
	if len(devices) != n || n == 0 {
		return false
	}
	seen := map[int]bool{}
	for _, d := range devices {
		i, ok := cudaIndex(d)
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
	}
	return true
}

// physical is the CUDA_VISIBLE_DEVICES entry of dflow's device i: dflow's
// own CUDA_VISIBLE_DEVICES renumbers the devices it sees, and the spec's
// cuda:N is in dflow's numbering.
func physical(i int) string {
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok && v != "" {
		if ids := strings.Split(v, ","); i < len(ids) {
			return strings.TrimSpace(ids[i])
		}
	}
	return strconv.Itoa(i)
}

// collectives runs a group member's Collective messages against its
// replica's group, each in a goroutine of its own (the stream's reader
// does not wait), answering with a CollectiveResult.
type collectives struct {
	r    nodes.Replica
	send func(*proto.Message) error
	wg   sync.WaitGroup
}

// do starts one collective; ctx ends it if the replica ends first.
func (c *collectives) do(ctx context.Context, m *proto.Collective) {
	c.wg.Go(func() {
		res := &proto.CollectiveResult{Id: m.Id}
		g := c.r.Group()
		var err error
		switch m.Op {
		case proto.CollectiveOp_COLLECTIVE_BARRIER:
			err = g.Barrier(ctx)
		case proto.CollectiveOp_COLLECTIVE_ALL_REDUCE:
			v := nodes.Floats(m.Values)
			var n int
			n, err = g.AllReduce(ctx, v)
			res.Values, res.Members = v, int32(n)
		case proto.CollectiveOp_COLLECTIVE_FINISH:
			res.Last, err = g.Finish(ctx)
		case proto.CollectiveOp_COLLECTIVE_SAVES:
			err = g.Saves(ctx)
		case proto.CollectiveOp_COLLECTIVE_SAVED:
			err = g.Saved(ctx, int(m.Step))
		default:
			err = fmt.Errorf("no collective %d", m.Op)
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return // the replica has ended: no one waits for the answer
			}
			res.Error = err.Error()
		}
		// A stream that broke is the reader's to report.
		_ = c.send(&proto.Message{Msg: &proto.Message_CollectiveResult{CollectiveResult: res}})
	})
}

// restoreStep is what a member of a kind that restores (Kind.restores)
// starts with, its Start's restore_step: its group saves (Group.Saves:
// on a cluster, its inputs are settled only once a save holds them), and
// Keep says whether this start is a restart of the group lost whole,
// which restores the save Keep names (nil: a first start). A plugin's
// state never moves from one member to another (pluginState): its group
// restarts whole.
func restoreStep(ctx context.Context, r nodes.Replica) (*int64, error) {
	g := r.Group()
	if err := g.Saves(ctx); err != nil {
		return nil, err
	}
	err := g.Keep(ctx, pluginState{})
	var re *nodes.Restore
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &re):
		step := int64(re.Step)
		return &step, nil
	}
	return nil, err
}

// pluginState is a plugin group member's state as the group sees it
// (nodes.State): none it can move, for the plugin keeps its own.
type pluginState struct{}

var errStateStays = errors.New("a plugin's group does not hand its state from one member to another: its group restarts whole from its last save")

func (pluginState) MarshalBinary() ([]byte, error) { return nil, errStateStays }
func (pluginState) UnmarshalBinary([]byte) error   { return errStateStays }
