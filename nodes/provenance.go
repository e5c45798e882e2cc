package nodes

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
)

// Run is the run that the files a node writes are written by: its id and
// when it started. A run is one dflow process (`dflow run`, or every run
// of one `dflow compare`), or one run across hosts: each worker takes the
// coordinator's run for the job it serves (SetRun), so that the replicas
// of one stage on several workers write one run's file.
type Run struct {
	ID      string    `json:"id"`
	Started time.Time `json:"started"`
}

var current atomic.Pointer[Run]

func init() {
	current.Store(&Run{ID: newRunID(), Started: time.Now().UTC().Truncate(time.Second)})
}

// CurrentRun is the run this process writes files for.
func CurrentRun() Run { return *current.Load() }

// SetRun makes files written from now on this run's: a worker serving a
// job across hosts sets the coordinator's run before it builds the
// stages. A zero Run leaves the process's own.
func SetRun(r Run) {
	if r.ID != "" {
		current.Store(&r)
	}
}

func newRunID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return strconv.FormatInt(time.Now().UnixNano(), 16)
	}
	return hex.EncodeToString(b[:])
}

// ExpandPath expands $VAR and ${VAR} in a path a node's config names;
// $GOROOT falls back to the Go root this binary was built with, so
// "$GOROOT/src" works on any machine that can build dflow.
func ExpandPath(p string) string {
	return os.Expand(p, func(v string) string {
		if val := os.Getenv(v); val != "" {
			return val
		}
		if v == "GOROOT" {
			return runtime.GOROOT()
		}
		return ""
	})
}
