package host

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPluginStage moves items through the pass node as a plugin
// (its own process, gRPC, the codec, 1 MiB chunks) and in-process (the
// same node registered as a built-in), with small (64 B) and large
// (16 MiB) payloads. One op is one item; MB/s counts payload bytes.
func BenchmarkPluginStage(b *testing.B) {
	for _, size := range []int{64, 16 << 20} {
		for _, where := range []string{"plugin", "in-process"} {
			b.Run(fmt.Sprintf("%s/%dB", where, size), func(b *testing.B) {
				f := newFixture(b)
				kind := "tp/pass"
				if where == "plugin" {
					if _, err := f.h.Load("tp", wrapper(b, f.dir, "tp", "serve"), f.reg); err != nil {
						b.Fatal(err)
					}
				} else {
					local := passKind
					local.Name, kind = "local_pass", "local_pass"
					f.reg.Register(local)
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				start := time.Now()
				if _, err := f.run(fmt.Sprintf(passSpec, b.N, size, kind, 1)); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
			})
		}
	}
}
