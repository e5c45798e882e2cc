package sdk

import (
	"slices"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// ChunkSize bounds the payload bytes of one Item message, below gRPC's
// 4 MiB default message limit.
const ChunkSize = 1 << 20

// SendItem encodes an item and sends it on port as Item messages of at
// most ChunkSize bytes, the first saying the whole payload's size. An
// item that fits in one chunk goes as one message; a larger one goes as
// its pieces (see encode), each cut into chunks, so that its arrays are
// never copied into one buffer on this side.
func SendItem(send func(*proto.Message) error, port string, item any) error {
	typ, pieces, err := encode(item)
	if err != nil {
		return err
	}
	size := 0
	for _, p := range pieces {
		size += len(p)
	}
	if size <= ChunkSize && len(pieces) > 1 {
		pieces = [][]byte{slices.Concat(pieces...)}
	} else if size > ChunkSize {
		pieces = slices.DeleteFunc(pieces, func(p []byte) bool { return len(p) == 0 })
	}
	for i, p := range pieces {
		for {
			n := min(len(p), ChunkSize)
			chunk := &proto.Item{Port: port, Type: typ, Payload: p[:n], More: n < len(p) || i < len(pieces)-1}
			if i == 0 && len(p) == len(pieces[0]) {
				chunk.Size = int64(size)
			}
			if err := send(&proto.Message{Msg: &proto.Message_Item{Item: chunk}}); err != nil {
				return err
			}
			if p = p[n:]; len(p) == 0 {
				break
			}
		}
	}
	return nil
}

// maxPrealloc bounds what an Assembler allocates on a first chunk's word:
// a larger item grows as its chunks come.
const maxPrealloc = 1 << 30

// An Assembler puts items back together from their Item chunks, on one
// stream.
type Assembler struct {
	buf []byte
}

// Add takes an item's next chunk; once it has the last one it returns the
// item's whole payload and true. An item sent in one chunk is its payload,
// not a copy; a larger one is assembled in a buffer allocated once, at
// the size its first chunk gives.
func (a *Assembler) Add(c *proto.Item) ([]byte, bool) {
	if a.buf == nil {
		if !c.More {
			return c.Payload, true
		}
		a.buf = make([]byte, 0, max(min(c.Size, maxPrealloc), int64(len(c.Payload))))
	}
	a.buf = append(a.buf, c.Payload...)
	if c.More {
		return nil, false
	}
	b := a.buf
	a.buf = nil
	return b, true
}
