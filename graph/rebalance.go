package graph

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Rebalance is the spec's rebalance block (or what `dflow run --rebalance`
// makes for a spec without one): stages that share a budget of replicas
// and devices, between which dflow moves replicas while the run goes, as
// the bottleneck moves.
//
//	rebalance {
//	  stages    = ["target", "drafter"]
//	  replicas  = 8       # the budget; default: the stages' replicas summed
//	  every     = "10s"   # how often to look
//	  min_gain  = 0.05    # least gain worth a move, a share of the time left
//	  move_cost = "20s"   # what one move costs: a replica's start
//	  hold      = "60s"   # no move back within this window
//	  horizon   = "10m"   # the time left an open-ended run assumes
//	}
//
// A Graph from Load or Build with a Rebalance has been checked: at least
// two known stages, none a source, every edge into or out of them shared
// (their replica counts change during the run), all on one kind of device,
// and a budget of at least one replica per stage and no fewer than they
// start with.
type Rebalance struct {
	Stages []string
	// Replicas is the budget the stages share.
	Replicas int
	// Devices, if set, are the budget's devices: the stages' replica i
	// in the budget's order runs on Devices[i % len(Devices)]. Empty:
	// each stage keeps its own devices.
	Devices []string
	// Every is how often the split is looked at; the first look comes
	// as soon as every replica of the stages has a few measured items.
	Every time.Duration
	// MinGain is the least gain worth a move: the time a move is
	// predicted to save over the work left, less its cost, as a share of
	// the time left at the current split.
	MinGain float64
	// MoveCost is what one replica moved costs, for kinds that do not
	// measure it: the time its device gives no work while the new
	// replica starts (a model's load on a GPU: seconds to minutes).
	MoveCost time.Duration
	// Hold is the hysteresis window: after a move, no move the other way
	// between the same stages within it.
	Hold time.Duration
	// Horizon is the time left an open-ended run (a source with no known
	// count) assumes.
	Horizon time.Duration
	// FromFlag: made by `dflow run --rebalance`, not written in the spec.
	FromFlag bool

	DeclRange, StagesRange, ReplicasRange, DevicesRange hcl.Range
}

// The rebalance block's defaults.
const (
	DefaultRebalanceEvery   = 10 * time.Second
	DefaultRebalanceMinGain = 0.05
	DefaultRebalanceHold    = 60 * time.Second
	DefaultRebalanceHorizon = 10 * time.Minute
)

// rebalanceDraft is a rebalance block as read, checked once the stages
// and edges are known (checkRebalance).
type rebalanceDraft struct {
	r             Rebalance
	replicas      cty.Value // cty.NilVal when not given
	replicasGiven bool
}

var rebalanceSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "stages", Required: true},
		{Name: "replicas"},
		{Name: "devices"},
		{Name: "every"},
		{Name: "min_gain"},
		{Name: "move_cost"},
		{Name: "hold"},
		{Name: "horizon"},
	},
}

func defaultRebalance() Rebalance {
	return Rebalance{Every: DefaultRebalanceEvery, MinGain: DefaultRebalanceMinGain,
		Hold: DefaultRebalanceHold, Horizon: DefaultRebalanceHorizon}
}

func (d *decoder) decodeRebalance(b *hcl.Block) {
	if first, dup := d.declared["rebalance"]; dup {
		d.errorf(b.DefRange, "duplicate rebalance block",
			"A spec has at most one rebalance block (list every stage that shares the budget in its stages); the first is at %s.", at(first))
		return
	}
	d.declared["rebalance"] = b.DefRange
	content, diags := b.Body.Content(rebalanceSchema)
	d.diags = append(d.diags, diags...)
	rd := &rebalanceDraft{r: defaultRebalance()}
	rd.r.DeclRange = b.DefRange
	if a, ok := content.Attributes["stages"]; ok {
		rd.r.StagesRange = a.Expr.Range()
		if v, ok := d.value(a, cty.List(cty.String), `a list of stage names, such as ["target", "drafter"]`); ok {
			for _, e := range v.AsValueSlice() {
				rd.r.Stages = append(rd.r.Stages, e.AsString())
			}
		}
	}
	if a, ok := content.Attributes["replicas"]; ok {
		rd.r.ReplicasRange = a.Expr.Range()
		if v, ok := d.value(a, cty.Number, "a whole number"); ok {
			rd.replicas, rd.replicasGiven = v, true
		}
	}
	if a, ok := content.Attributes["devices"]; ok {
		rd.r.DevicesRange = a.Expr.Range()
		if v, ok := d.value(a, cty.List(cty.String), "a list of device names"); ok {
			for _, e := range v.AsValueSlice() {
				rd.r.Devices = append(rd.r.Devices, e.AsString())
			}
			if len(rd.r.Devices) == 0 {
				d.errorf(a.Expr.Range(), "invalid devices", "devices must list at least one device, such as [\"cuda:0\", \"cuda:1\"], or be left out (each stage keeps its own).")
			}
		}
	}
	durations := []struct {
		name    string
		to      *time.Duration
		zeroOK  bool
		what    string
		example string
	}{
		{"every", &rd.r.Every, false, "how often the split is looked at", "10s"},
		{"move_cost", &rd.r.MoveCost, true, "what moving one replica costs (a replica's start)", "20s"},
		{"hold", &rd.r.Hold, true, "how long after a move no move goes back", "60s"},
		{"horizon", &rd.r.Horizon, false, "the time left an open-ended run assumes", "10m"},
	}
	for _, du := range durations {
		a, ok := content.Attributes[du.name]
		if !ok {
			continue
		}
		s, ok := d.stringAttr(a)
		if !ok {
			continue
		}
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || (v == 0 && !du.zeroOK) {
			least := "above 0"
			if du.zeroOK {
				least = "0 or more"
			}
			d.errorf(a.Expr.Range(), "invalid "+du.name, "%s is %s, a duration %s such as %q; got %q.", du.name, du.what, least, du.example, s)
			continue
		}
		*du.to = v
	}
	if a, ok := content.Attributes["min_gain"]; ok {
		if v, ok := d.value(a, cty.Number, "a number"); ok {
			g, _ := v.AsBigFloat().Float64()
			if !(g >= 0) || g >= 1 {
				d.errorf(a.Expr.Range(), "invalid min_gain",
					"min_gain is the least gain worth a move, as a share of the time left (0.05: 5%%), from 0 up to below 1; got %g.", g)
			} else {
				rd.r.MinGain = g
			}
		}
	}
	d.rebalance = rd
}

// WithRebalance returns a copy of g whose replicas move between r's
// stages (what `dflow run --rebalance` makes for a spec without a
// rebalance block), r checked as the block is. Zero fields take the
// block's defaults: the budget the stages' replicas summed (or the
// devices), Every, MinGain, Hold and Horizon their Default values.
func (g *Graph) WithRebalance(r Rebalance) (*Graph, hcl.Diagnostics) {
	b := newBuilder(nil, g.Filename)
	b.g = g.clone()
	def := defaultRebalance()
	if r.Every == 0 {
		r.Every = def.Every
	}
	if r.MinGain == 0 {
		r.MinGain = def.MinGain
	}
	if r.Hold == 0 {
		r.Hold = def.Hold
	}
	if r.Horizon == 0 {
		r.Horizon = def.Horizon
	}
	rd := &rebalanceDraft{r: r}
	if r.Replicas != 0 {
		rd.replicas, rd.replicasGiven = cty.NumberIntVal(int64(r.Replicas)), true
	}
	b.rebalance = rd
	b.checkRebalance()
	if b.diags.HasErrors() {
		return nil, b.diags
	}
	return b.g, b.diags
}

// WithoutRebalance returns a copy of g with no rebalance: its stages keep
// the split the spec gives (`--rebalance=false`).
func (g *Graph) WithoutRebalance() *Graph {
	c := g.clone()
	c.Rebalance = nil
	return c
}

// Movable lists the stages of g whose replicas can move (those a
// rebalance may name): not sources, every edge into and out of them
// shared, on the kind of device most of them share. why says, for each
// other stage, why its replicas cannot move.
func Movable(g *Graph) (stages, why []string) {
	byKind := map[string][]string{}
	var kinds []string
	for _, s := range g.Stages {
		if w, _ := whyNotMovable(s); w != "" {
			why = append(why, w)
			continue
		}
		k := stageDeviceKind(s)
		if k == "mixed" {
			why = append(why, fmt.Sprintf("stage %q runs on both CPUs and GPUs", s.Name))
			continue
		}
		if len(byKind[k]) == 0 {
			kinds = append(kinds, k)
		}
		byKind[k] = append(byKind[k], s.Name)
	}
	best := ""
	for _, k := range kinds {
		if len(byKind[k]) > len(byKind[best]) {
			best = k
		}
	}
	for _, k := range kinds {
		if k != best {
			for _, name := range byKind[k] {
				why = append(why, fmt.Sprintf("stage %q runs on %s devices, the others on %s", name, k, best))
			}
		}
	}
	return byKind[best], why
}

// deviceKind is "cpu" or "cuda" for a device name, "" for another.
func deviceKind(dev string) string {
	if dev == "cpu" {
		return "cpu"
	}
	if strings.HasPrefix(dev, "cuda:") {
		return "cuda"
	}
	return ""
}

// stageDeviceKind is the kind of a stage's devices, or "mixed".
func stageDeviceKind(s *Stage) string {
	kind := ""
	for i := range max(len(s.Devices), 1) {
		k := deviceKind(s.Device(i))
		if kind != "" && k != kind {
			return "mixed"
		}
		kind = k
	}
	return kind
}

// whyNotMovable says why a stage's replicas cannot move, or "".
func whyNotMovable(s *Stage) (why string, edge *Edge) {
	if len(s.Inputs) == 0 {
		return fmt.Sprintf("stage %q is a source: its items are split over its replicas as it starts", s.Name), nil
	}
	for i, ports := range [][]*Port{s.Inputs, s.Outputs} {
		for _, p := range ports {
			for _, e := range p.Edges {
				if e.Policy != Shared {
					return fmt.Sprintf("edge %q %s stage %q is %s", e.Name, [2]string{"into", "out of"}[i], s.Name, e.Policy), e
				}
			}
		}
	}
	return "", nil
}

// checkRebalance checks the rebalance block against the built stages and
// edges, and sets the graph's Rebalance.
func (b *Builder) checkRebalance() {
	rd := b.rebalance
	if rd == nil {
		return
	}
	r := rd.r
	at := orRange(r.StagesRange, r.DeclRange)
	ok := true
	if len(r.Stages) < 2 {
		b.errorf(at, "too few stages to rebalance", "%s", named(at, "rebalance",
			fmt.Sprintf("stages must name at least two stages that share the budget; got %d.", len(r.Stages))))
		ok = false
	}
	var stages []*Stage
	seen := map[string]bool{}
	for _, name := range r.Stages {
		s := b.g.stages[name]
		switch {
		case seen[name]:
			b.errorf(at, "duplicate stage in rebalance", "%s", named(at, "rebalance", fmt.Sprintf("stages names %q twice.", name)))
			ok = false
			continue
		case s == nil:
			b.errorf(at, "unknown stage", "%s", named(at, "rebalance", sentence(fmt.Sprintf("stages names %q, which is not a stage%s",
				name, DidYouMean(name, stageNames(b.g))))))
			ok = false
			continue
		}
		seen[name] = true
		stages = append(stages, s)
	}
	total := 0
	for _, s := range stages {
		total += s.Replicas
		if len(s.Inputs) > 0 {
			continue // its edges are checked below, once each
		}
		why, _ := whyNotMovable(s)
		where := orRange(s.NameRange, at)
		b.errorf(where, "stage cannot rebalance", "%s", named(where, fmt.Sprintf("stage %q", s.Name),
			sentence(why)+" Take it out of the rebalance block's stages."))
		ok = false
	}
	for _, e := range b.g.Edges {
		if e.From == nil || e.To == nil || e.Policy == Shared || !(seen[e.To.Stage.Name] || seen[e.From.Stage.Name]) {
			continue
		}
		// The edge is named where the spec wrote its policy.
		end, direction := e.To.Stage, "into"
		if !seen[end.Name] {
			end, direction = e.From.Stage, "out of"
		}
		where := e.PolicyRange
		b.errorf(where, "edge cannot rebalance", "%s", named(where, fmt.Sprintf("edge %q", e.Name), fmt.Sprintf(
			"Edge %q %s stage %q is %s, and the rebalance block moves that stage's replicas: %s gives each consumer replica a queue of its own, "+
				"wired by the replica counts, which change during the run. Use policy = \"shared\" (one queue every replica pushes to and pulls from).",
			e.Name, direction, end.Name, e.Policy, e.Policy)))
		ok = false
	}
	// One kind of device: a replica's device moves between the stages.
	kinds := map[string][]string{}
	for _, s := range stages {
		k := stageDeviceKind(s)
		kinds[k] = append(kinds[k], s.Name)
		if k == "mixed" {
			where := s.NameRange
			if d := b.drafts[s]; d != nil {
				where = orRange(d.devicesRange, where)
			}
			b.errorf(where, "stage cannot rebalance", "%s", named(where, fmt.Sprintf("stage %q", s.Name),
				fmt.Sprintf("Stage %q runs on both CPUs and GPUs (devices [%s]); a rebalanced stage's devices are of one kind, which its moved replicas share.", s.Name, quoted(s.Devices))))
			ok = false
		}
	}
	delete(kinds, "mixed")
	if len(kinds) > 1 {
		var parts []string
		for _, s := range stages {
			if k := stageDeviceKind(s); k != "mixed" {
				parts = append(parts, fmt.Sprintf("%s on %s", s.Name, k))
			}
		}
		b.errorf(at, "stages on different devices", "%s", named(at, "rebalance", fmt.Sprintf(
			"The stages run on different kinds of device (%s): a replica moves by leaving its device to a replica of another stage, so every rebalanced stage runs on one kind. "+
				"Give them devices of one kind, or rebalance only those that share one.", strings.Join(parts, ", "))))
		ok = false
	}
	if len(r.Devices) > 0 {
		plugin := len(stages) > 0
		for _, s := range stages {
			_, _, p := strings.Cut(s.Node, "/")
			plugin = plugin && p
		}
		b.checkDevices("rebalance", r.Devices, r.DevicesRange, plugin)
		budgetKind := ""
		for i, dev := range r.Devices {
			if k := deviceKind(dev); i == 0 {
				budgetKind = k
			} else if k != budgetKind {
				budgetKind = "mixed"
			}
		}
		for k := range kinds {
			if len(kinds) == 1 && budgetKind != "" && budgetKind != k {
				what := "a mix of CPUs and GPUs"
				if budgetKind != "mixed" {
					what = budgetKind + " devices"
				}
				b.errorf(r.DevicesRange, "stages on different devices", "%s", named(r.DevicesRange, "rebalance", fmt.Sprintf(
					"The budget's devices are %s, and the stages run on %s: the budget is of the one kind of device the stages run on.", what, k)))
				ok = false
			}
		}
	}
	// The budget.
	switch {
	case rd.replicasGiven:
		n, err := checkCount(rd.replicas, "replicas")
		if err != nil {
			b.errorf(r.ReplicasRange, "invalid replicas", "%s", named(r.ReplicasRange, "rebalance", fmt.Sprintf("replicas %v.", err)))
			return
		}
		r.Replicas = n
	case len(r.Devices) > 0:
		r.Replicas = len(r.Devices)
	default:
		r.Replicas = total
	}
	budget := orRange(r.ReplicasRange, orRange(r.DevicesRange, at))
	if ok && r.Replicas < len(stages) {
		b.errorf(budget, "budget too small", "%s", named(budget, "rebalance", fmt.Sprintf(
			"A budget of %s cannot give each of the %d stages one; every rebalanced stage keeps at least one replica.", plural(r.Replicas, "replica"), len(stages))))
		ok = false
	}
	if ok && total > r.Replicas {
		b.errorf(budget, "budget too small", "%s", named(budget, "rebalance", fmt.Sprintf(
			"The stages start with %d replicas (%s), more than the budget of %d; raise the budget or start with fewer.", total, startSplit(stages), r.Replicas)))
		ok = false
	}
	if ok {
		b.g.Rebalance = &r
	}
}

func startSplit(stages []*Stage) string {
	var parts []string
	for _, s := range stages {
		parts = append(parts, fmt.Sprintf("%s %d", s.Name, s.Replicas))
	}
	return strings.Join(parts, ", ")
}

func stageNames(g *Graph) []string {
	var names []string
	for _, s := range g.Stages {
		names = append(names, s.Name)
	}
	return names
}

// Rebalanced reports whether a stage is one the graph's Rebalance moves
// replicas of.
func (g *Graph) Rebalanced(stage string) bool {
	return g.Rebalance != nil && slices.Contains(g.Rebalance.Stages, stage)
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// quoted lists names as HCL writes them: "a", "b".
func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
