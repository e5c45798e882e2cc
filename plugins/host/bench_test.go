package host

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPluginStage moves items through the pass node as a plugin
// (its own process; large items by reference in shared memory: copied
// once into the replica's pool on the way in, and, passed on unchanged,
// handed on as the item that went in), as a plugin with shared memory off
// (plugin-grpc: gRPC, the codec, 1 MiB chunks, as before shared memory)
// and in-process (the same node registered as a built-in), with small
// (64 B) and large (16 MiB) payloads. One op is one item; MB/s counts
// payload bytes. A run includes starting the plugin's process (a few
// hundred ms here), so take enough items to amortize it: bench/run moves
// 30,000 small and 40 large ones; steady-MB/s leaves the start out (from
// the first item at the sink to the last). BenchmarkMemmove is the baseline of the
// large ones: the same bytes copied once in memory.
func BenchmarkPluginStage(b *testing.B) {
	for _, size := range []int{64, 16 << 20} {
		for _, where := range []string{"plugin", "plugin-grpc", "in-process"} {
			b.Run(fmt.Sprintf("%s/%dB", where, size), func(b *testing.B) {
				f := newFixture(b)
				kind := "tp/pass"
				if where == "in-process" {
					local := passKind
					local.Name, kind = "local_pass", "local_pass"
					f.reg.Register(local)
				} else {
					if where == "plugin-grpc" {
						b.Setenv("DFLOW_PLUGIN_SHM", "off") // dflow does not offer pools
					}
					if _, err := f.h.Load("tp", wrapper(b, f.dir, "tp", "serve"), f.reg); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				start := time.Now()
				if _, err := f.run(fmt.Sprintf(passSpec, b.N, size, kind, 1)); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
				if b.N > 1 {
					b.ReportMetric(f.got.steady(b.N)*float64(size)/1e6, "steady-MB/s")
				}
			})
		}
	}
}

// BenchmarkMemmove is the baseline of BenchmarkPluginStage's 16 MiB items:
// copy() of 16 MiB between two buffers that stay allocated (and so
// mapped), the bandwidth of one copy in memory on this machine.
func BenchmarkMemmove(b *testing.B) {
	const size = 16 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		copy(dst, src)
	}
}

// BenchmarkSocketRoundTrip is the transport's limit for the 16 MiB
// figure of BenchmarkPluginStage: the same bytes to an echo goroutine over
// a Unix socket (what go-plugin connects over) and back, in 1 MiB writes,
// with no encoding, framing or copies of their own. One op is one item
// there and back.
func BenchmarkSocketRoundTrip(b *testing.B) {
	const size = 16 << 20
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		b.Skip("no socketpair:", err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	here, there := conn(fds[0]), conn(fds[1])
	defer here.Close()
	go func() {
		defer there.Close()
		item := make([]byte, size)
		for {
			if _, err := io.ReadFull(there, item); err != nil {
				return
			}
			if _, err := writeChunks(there, item); err != nil {
				return
			}
		}
	}()
	out, back := make([]byte, size), make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		if _, err := writeChunks(here, out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(here, back); err != nil {
			b.Fatal(err)
		}
	}
}

func writeChunks(w io.Writer, b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k, err := w.Write(b[:min(len(b), 1<<20)])
		if n += k; err != nil {
			return n, err
		}
		b = b[k:]
	}
	return n, nil
}
