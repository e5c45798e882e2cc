package wire

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
	e, err := EncodeItem(item)
	if err != nil {
		return err
	}
	return e.Send(send, port)
}

// Encoded is an item as it goes on the wire: its type, the pieces of its
// payload and their total size.
type Encoded struct {
	Type   string
	Pieces [][]byte
	Size   int
}

// EncodeItem encodes an item for the wire (see encode).
func EncodeItem(item any) (Encoded, error) {
	typ, pieces, err := encode(item)
	e := Encoded{Type: typ, Pieces: pieces}
	for _, p := range pieces {
		e.Size += len(p)
	}
	return e, err
}

// Whole is the payload in one slice, copied only if it has several pieces.
func (e Encoded) Whole() []byte {
	if len(e.Pieces) == 1 {
		return e.Pieces[0]
	}
	return slices.Concat(e.Pieces...)
}

// Send sends the item as Item messages (see SendItem).
func (e Encoded) Send(send func(*proto.Message) error, port string) error {
	pieces := e.Pieces
	if e.Size <= ChunkSize {
		pieces = [][]byte{e.Whole()}
	} else {
		pieces = slices.DeleteFunc(slices.Clone(pieces), func(p []byte) bool { return len(p) == 0 })
	}
	for i, p := range pieces {
		for {
			n := min(len(p), ChunkSize)
			chunk := &proto.Item{Port: port, Type: e.Type, Payload: p[:n], More: n < len(p) || i < len(pieces)-1}
			if i == 0 && len(p) == len(pieces[0]) {
				chunk.Size = int64(e.Size)
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
const maxPrealloc = 64 << 20

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

// A batch holds at most this many items, and items of at most ChunkSize
// bytes in all.
const MaxBatchItems = 64

// A Batcher sends items on a stream, several small ones to a message (a
// Batch) when the receiving side takes them: its owner adds the items it
// has at hand and flushes, so that items go out together when they come
// faster than the stream takes them, and alone, at once, when they do
// not. Items of more than ChunkSize bytes go in chunks, after what is
// pending. One goroutine uses a Batcher.
type Batcher struct {
	Send    func(*proto.Message) error
	Batches bool // the receiver takes Batch messages
	items   []*proto.Item
	size    int
}

// Add sends an item, or holds it for the next Flush.
func (b *Batcher) Add(port string, item any) error {
	e, err := EncodeItem(item)
	if err != nil {
		return err
	}
	return b.AddEncoded(port, e)
}

// AddRef sends an item by reference (Item.ref), or holds it for the next
// Flush: it goes in a Batch with others when the receiver takes them.
func (b *Batcher) AddRef(port, typ string, ref *proto.Ref) error {
	it := &proto.Item{Port: port, Type: typ, Size: ref.Length, Ref: ref}
	if !b.Batches {
		return b.Send(&proto.Message{Msg: &proto.Message_Item{Item: it}})
	}
	if len(b.items) == MaxBatchItems {
		if err := b.Flush(); err != nil {
			return err
		}
	}
	b.items = append(b.items, it)
	return nil
}

func (b *Batcher) AddEncoded(port string, e Encoded) error {
	if !b.Batches {
		return e.Send(b.Send, port)
	}
	if e.Size > ChunkSize {
		if err := b.Flush(); err != nil {
			return err
		}
		return e.Send(b.Send, port)
	}
	if b.size+e.Size > ChunkSize || len(b.items) == MaxBatchItems {
		if err := b.Flush(); err != nil {
			return err
		}
	}
	b.items = append(b.items, &proto.Item{Port: port, Type: e.Type, Payload: e.Whole(), Size: int64(e.Size)})
	b.size += e.Size
	return nil
}

// Flush sends the items held: one alone as an Item, several as a Batch.
func (b *Batcher) Flush() error {
	var m *proto.Message
	switch len(b.items) {
	case 0:
		return nil
	case 1:
		m = &proto.Message{Msg: &proto.Message_Item{Item: b.items[0]}}
	default:
		m = &proto.Message{Msg: &proto.Message_Batch{Batch: &proto.Batch{Items: b.items}}}
	}
	b.items, b.size = nil, 0
	return b.Send(m)
}
