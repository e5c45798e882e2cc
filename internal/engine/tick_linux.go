package engine

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// kernelTicker is a ticker on a Linux timerfd, read through the runtime's
// netpoller: a goroutine waiting on it holds no thread and no P, and no Go
// timer is pending meanwhile.
type kernelTicker struct {
	f *os.File
}

func newKernelTicker(period time.Duration) (ticker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	ts := unix.NsecToTimespec(int64(max(period, time.Microsecond)))
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "dflow-sampler-timerfd")
	// A file the netpoller does not watch would be read in a blocking
	// system call, holding a P for up to a period: refuse it. Only a
	// polled file has deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, errors.New("timerfd is not pollable")
	}
	return &kernelTicker{f: f}, nil
}

func (k *kernelTicker) wait() bool {
	var expirations [8]byte // how many periods passed; one tick for all
	_, err := k.f.Read(expirations[:])
	return err == nil
}

// stop closes the timer; a wait in progress returns false.
func (k *kernelTicker) stop() { k.f.Close() }
