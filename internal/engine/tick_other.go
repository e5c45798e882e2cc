//go:build !linux

package engine

import (
	"errors"
	"time"
)

func newKernelTicker(time.Duration) (ticker, error) {
	return nil, errors.New("no kernel ticker on this system")
}
