package dataplane

import (
	"context"
	"testing"
)

func BenchmarkFetch(b *testing.B) {
	dp, err := New("r", "k", "127.0.0.1", false)
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	dp.Put("x", [][]byte{make([]byte, 16<<20)}, nil, nil)
	b.SetBytes(16 << 20)
	for range b.N {
		if _, err := dp.Fetch(context.Background(), Ref{Addr: dp.Addr(), Size: 16 << 20}, "x"); err != nil {
			b.Fatal(err)
		}
	}
}
