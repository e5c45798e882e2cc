package nn

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/nodes"
)

// Provenance. Every model and checkpoint dflow writes records, in its
// __metadata__, the run that wrote it: run_id (random), run_started
// (RFC 3339) and spec (the spec file, when known). A run is one dflow
// process (`dflow run`, or every run of one `dflow compare`), or one run
// across hosts: each worker takes the coordinator's run for the job it
// serves (SetRun), so that the replicas of one stage on several workers
// write one run's file. A stage that
// writes a file claims it when the stage is built, before any work
// (ClaimOutput), and refuses a file another run wrote unless told to
// replace it; before each write it checks that no other run wrote the file
// meanwhile (Output.Check). The run's own periodic checkpoints overwrite
// one another freely.

// Run is the run files are written by (nodes.Run: the node API's, so that
// the runtime sets it without knowing the models).
type Run = nodes.Run

// CurrentRun is the run this process writes files for.
func CurrentRun() Run { return nodes.CurrentRun() }

// SetRun makes files written from now on this run's (nodes.SetRun).
func SetRun(r Run) { nodes.SetRun(r) }

// RunID is this run's id, as files it writes record it.
func RunID() string { return nodes.CurrentRun().ID }

// RunMetadata is the metadata that marks a file as written by this run;
// spec may be "".
func RunMetadata(spec string) map[string]string {
	r := nodes.CurrentRun()
	m := map[string]string{"run_id": r.ID, "run_started": r.Started.Format(time.RFC3339)}
	if spec != "" {
		m["spec"] = spec
	}
	return m
}

// Output guards a file that a stage writes.
type Output struct {
	Path string
	// existed and prior: the file was there when the stage was built and
	// the stage was allowed to replace it; prior is that file's run_id.
	existed bool
	prior   string
}

// ClaimOutput is called when a stage is built, before any work. path may
// be written when it does not exist, when this run wrote it, or when
// replace is set (the stage resumes from it or was told to overwrite it).
// Otherwise the error names the file and what it holds, then waysOut:
// how to go on.
func ClaimOutput(path string, replace bool, waysOut string) (*Output, error) {
	meta, err := ReadSafetensorsMetadata(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Output{Path: path}, nil
	}
	o := &Output{Path: path, existed: true, prior: meta["run_id"]}
	if replace || (err == nil && meta["run_id"] == RunID()) {
		return o, nil
	}
	return nil, fmt.Errorf("%s already exists: %s; refusing to overwrite it. %s", path, DescribeFile(meta, err), waysOut)
}

// Check is called before each write: the file must be absent, this run's,
// or the one the stage was allowed to replace when it was built.
func (o *Output) Check() error {
	meta, err := ReadSafetensorsMetadata(o.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if id := meta["run_id"]; (id == RunID() && err == nil) || (o.existed && id == o.prior) {
		return nil
	}
	return fmt.Errorf("%s was written by another run while this one ran (%s); not overwriting it", o.Path, DescribeFile(meta, err))
}

// DescribeFile says in words what a safetensors file holds and who wrote
// it, from its metadata (or the error reading it).
func DescribeFile(meta map[string]string, err error) string {
	if err != nil {
		return "it is not a safetensors file"
	}
	what := "a safetensors file"
	switch meta["format"] {
	case "dflow-drafter":
		what = "a drafter checkpoint"
	case "dflow-lm":
		what = "a target LM"
	}
	var parts []string
	if s := meta["step"]; s != "" {
		parts = append(parts, "step "+s)
	}
	if s := meta["steps"]; s != "" {
		parts = append(parts, s+" steps")
	}
	switch {
	case meta["run_id"] == RunID():
		return what + " written by this run"
	case meta["run_id"] == "" && meta["format"] != "":
		parts = append(parts, "written by a dflow that did not record its runs")
	case meta["run_id"] == "":
	default:
		if s := meta["run_started"]; s != "" {
			parts = append(parts, "run started "+s)
		}
		if s := meta["spec"]; s != "" {
			parts = append(parts, "spec "+s)
		}
	}
	if meta["format"] != "" {
		what += " from another run"
	}
	if len(parts) == 0 {
		return what
	}
	return what + " (" + strings.Join(parts, ", ") + ")"
}

// FileSHA256 is the hex SHA-256 of a file's content: how a drafter records
// the exact target it was trained against.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
