//go:build !linux

package wire

import (
	"errors"

	"github.com/dflow-dev/dflow/plugins/proto"
)

const shmSupported = false

var errNoShm = errors.New("shared memory pools need Linux (memfd)")

// CreatePools is Linux only: elsewhere items cross as bytes.
func CreatePools(inSize, outSize int64) (*Pools, error) { return nil, errNoShm }

// OpenPools is Linux only.
func OpenPools(*proto.Pools) (*Pools, error) { return nil, errNoShm }

func closeFd(int) {}

func unmap([]byte) {}
