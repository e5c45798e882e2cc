package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/dflow-dev/dflow/internal/nn"
)

func main() {
	model := flag.String("model", "models/target.safetensors", "the target model")
	out := flag.String("o", "", "write the logits here")
	B := flag.Int("b", 8, "batch size")
	T := flag.Int("t", 128, "sequence length")
	flag.Parse()
	m, _, err := nn.LoadModel(*model)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w, err := m.NewWorkspace(*B, *T)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tokens := make([]int32, *B**T)
	for i := range tokens {
		tokens[i] = int32((i*31 + 7) % 256) // the same batch torch_ref.py builds
	}
	start := time.Now()
	logits := w.Forward(tokens)
	fmt.Printf("backend %s, forward %.1f ms\n", nn.Backend, float64(time.Since(start).Microseconds())/1000)
	if *out != "" {
		b := make([]byte, 4*len(logits))
		for i, v := range logits {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
