package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Status values.
const (
	OK          = "ok"
	Failed      = "failed"
	Interrupted = "interrupted"
	// Aborted is a run stopped before its drain finished: a second
	// Ctrl-C, or a drain that could not complete because nothing left
	// could move. Its produced and consumed counts may differ.
	Aborted = "aborted"
)

// Report is one run of a spec.
type Report struct {
	Spec        string  `json:"spec"`
	Status      string  `json:"status"`
	Error       string  `json:"error"`
	Simulated   bool    `json:"simulated"`
	WallSeconds float64 `json:"wall_seconds"`
	// Version is the dflow that made the report (`dflow --version`).
	Version string `json:"version,omitempty"`
	// Started is the wall-clock time the run (or the simulation) began.
	Started time.Time `json:"started,omitzero"`
	// Overrides are the command-line settings the spec was loaded with,
	// so that a report says which variant of the spec it measured.
	Overrides Overrides        `json:"overrides"`
	Stages    map[string]Stage `json:"stages"`
	Edges     map[string]Edge  `json:"edges"`
	Series    []Sample         `json:"series"`
	Diagnosis []string         `json:"diagnosis"`
	// Moves are the moves of replicas between the stages of a rebalance
	// block, in time order; none without one.
	Moves []Move `json:"moves,omitempty"`

	// the spec's order of stages and edges (SetOrder, or the order read
	// from JSON): the JSON and the summary follow it
	stageOrder, edgeOrder []string
}

// Move is one move of replicas between two stages of a rebalance: at T
// seconds, Replicas replicas of From left and as many of To started.
// From is "" for replicas of the budget that no stage had.
type Move struct {
	T        float64 `json:"t"`
	From     string  `json:"from"`
	To       string  `json:"to"`
	Replicas int     `json:"replicas"`
	// Reason says how busy the stages were ("target 100% busy, drafter
	// 41%").
	Reason string `json:"reason"`
	// PredictedGain is the share of the time left the move was predicted
	// to save, its cost taken off.
	PredictedGain float64 `json:"predicted_gain"`
	// MeasuredGain is the same share as the run measured it: 1 less the
	// rate in the interval before the move over the rate in the interval
	// after it (to the next look, or the end), a rate being the items
	// through the rebalanced stages a second (the fewest any took in);
	// absent when either interval had none.
	MeasuredGain *float64 `json:"measured_gain,omitempty"`
}

// Overrides are the --var, --var-file and --set flags of a run, in the
// order given.
type Overrides struct {
	Vars     map[string]string `json:"vars,omitempty"`
	VarFiles []string          `json:"var_files,omitempty"`
	Sets     []string          `json:"sets,omitempty"`
}

// Stage is one stage's figures.
type Stage struct {
	Node     string             `json:"node"`
	Replicas []Replica          `json:"replicas"`
	Metrics  map[string]float64 `json:"metrics"`
}

// Replica is one replica's figures. Busy, idle and blocked seconds add up
// to the replica's lifetime.
type Replica struct {
	Index  int    `json:"index"`
	Device string `json:"device"`
	// Worker is the cluster worker the replica ran on (a cluster run;
	// "a>b" when it restarted on b after a was lost).
	Worker         string  `json:"worker,omitempty"`
	ItemsIn        int64   `json:"items_in"`
	ItemsOut       int64   `json:"items_out"`
	BusySeconds    float64 `json:"busy_seconds"`
	IdleSeconds    float64 `json:"idle_seconds"`
	BlockedSeconds float64 `json:"blocked_seconds"`
	Utilization    float64 `json:"utilization"`
	ServiceSeconds Summary `json:"service_seconds"`
}

// Summary summarizes a distribution of durations, in seconds.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// Edge is one edge's figures.
type Edge struct {
	// From and To are the stages the edge joins, so that a saved report
	// draws its graph without its spec.
	From          string  `json:"from,omitempty"`
	To            string  `json:"to,omitempty"`
	Policy        string  `json:"policy"`
	Capacity      int     `json:"capacity"`
	CapacityBytes int64   `json:"capacity_bytes,omitempty"`
	Produced      int64   `json:"produced"`
	Consumed      int64   `json:"consumed"`
	Queues        []Queue `json:"queues"`
	// Carried says how a run across hosts carried the edge (one of the
	// Carried constants; empty in one process).
	Carried string `json:"carried,omitempty"`
}

// How an edge was carried across hosts (Edge.Carried).
const (
	// CarriedCrosses: on JetStream, between workers.
	CarriedCrosses = "crosses hosts"
	// CarriedStream: on JetStream within one worker, for the stage it
	// feeds restarts elsewhere after a loss.
	CarriedStream = "stream"
	// CarriedChain: in process, a chain's edge: its items are settled
	// through the input at the chain's head.
	CarriedChain = "chain"
	// CarriedProcess: in process, on one worker.
	CarriedProcess = "in process"
)

// Queue is one queue of an edge.
type Queue struct {
	Producers []int   `json:"producers"`
	Consumers []int   `json:"consumers"`
	MeanDepth float64 `json:"mean_depth"`
	MaxDepth  int64   `json:"max_depth"`
}

// Sample is one point of the time series.
type Sample struct {
	T           float64              `json:"t"`
	Queues      map[string][]int     `json:"queues"`
	Utilization map[string][]float64 `json:"utilization"`
	// Idle is each replica's share of the interval spent waiting for
	// input: a starved replica stands out here even when a sync step
	// keeps its busy share level with its siblings'.
	Idle map[string][]float64 `json:"idle,omitempty"`
	// Metrics are the node metrics at the point, stage -> name -> value
	// (gauges their latest value, counters their sum so far): the loss
	// and acceptance length curves of a training run.
	Metrics map[string]map[string]float64 `json:"metrics,omitempty"`
	// Items is each stage's items so far, summed over its replicas:
	// received, or emitted by a source (a stage with no inputs). Two
	// successive samples give the stage's throughput in items/s.
	Items map[string]int64 `json:"items,omitempty"`
	// Replicas is the size of each stage of a rebalance that moves
	// replicas (StageSnapshot.Size): its replicas at the point, less
	// those moved away.
	Replicas map[string]int `json:"replicas,omitempty"`
}

// Write saves the report as indented JSON, with no HTML escapes (a
// restarted replica's worker reads "a>b", as the docs write it).
func (r *Report) Write(path string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// Read loads a saved report.
func Read(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: %s: %w", path, err)
	}
	return &r, nil
}
