package cluster

import (
	"context"
	"testing"
)

func BenchmarkDataPlaneFetch(b *testing.B) {
	dp, err := newDataPlane("r", "k", "127.0.0.1", false)
	if err != nil {
		b.Fatal(err)
	}
	defer dp.close()
	dp.put("x", [][]byte{make([]byte, 16<<20)}, nil, nil)
	b.SetBytes(16 << 20)
	for range b.N {
		if _, err := dp.fetch(context.Background(), ref{addr: dp.addr, size: 16 << 20}, "x"); err != nil {
			b.Fatal(err)
		}
	}
}
