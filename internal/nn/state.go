package nn

import (
	"encoding/binary"
	"fmt"
	"math"
)

// TrainState is a replica's training state as bytes, for a replica group
// to hand to a member restarted elsewhere (nodes.State): the step
// counter, AdamW's count and the batches seen as uint64s, then the
// parameters and the two moments as little-endian float32s. It reads and
// writes the buffers in place, wherever they live.
type TrainState struct {
	Params Buffer
	Opt    *AdamW
	Step   *int
	// Batches counts the batches whose gradients the state holds (nil:
	// not counted)
	Batches *int
}

const stateHeader = 24

// MarshalBinary writes the state as of now.
func (s TrainState) MarshalBinary() ([]byte, error) {
	m, v, t := s.Opt.State()
	n := s.Params.Len()
	b := make([]byte, stateHeader, stateHeader+12*n)
	binary.LittleEndian.PutUint64(b, uint64(*s.Step))
	binary.LittleEndian.PutUint64(b[8:], uint64(t))
	if s.Batches != nil {
		binary.LittleEndian.PutUint64(b[16:], uint64(*s.Batches))
	}
	host := make([]float32, n)
	for _, buf := range []Buffer{s.Params, m, v} {
		buf.Backend().ToHost(host, buf)
		for _, x := range host {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b, nil
}

// UnmarshalBinary sets the state from what MarshalBinary wrote, for the
// same shape of parameters.
func (s TrainState) UnmarshalBinary(b []byte) error {
	n := s.Params.Len()
	if len(b) != stateHeader+12*n {
		return fmt.Errorf("a training state of %d bytes, for %d parameters (want %d bytes)", len(b), n, stateHeader+12*n)
	}
	*s.Step = int(binary.LittleEndian.Uint64(b))
	t := int(binary.LittleEndian.Uint64(b[8:]))
	if s.Batches != nil {
		*s.Batches = int(binary.LittleEndian.Uint64(b[16:]))
	}
	m, v, _ := s.Opt.State()
	host := make([]float32, n)
	for k, buf := range []Buffer{s.Params, m, v} {
		off := stateHeader + 4*n*k
		for i := range host {
			host[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off+4*i:]))
		}
		buf.Backend().FromHost(buf, host)
	}
	s.Opt.SetState(m, v, t)
	return nil
}
