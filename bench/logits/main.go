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
	train := flag.Int("train", 0, "then run this many training steps of the target and of a drafter, and print their final losses and weight hashes")
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
	res := w.Forward(tokens)
	fmt.Printf("backend %s, forward %.1f ms\n", m.Backend().Name(), float64(time.Since(start).Microseconds())/1000)
	logits := make([]float32, res.Len())
	m.Backend().ToHost(logits, res)
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
	if *train > 0 {
		if err := trainParity(m, tokens, *B, *T, *train); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
