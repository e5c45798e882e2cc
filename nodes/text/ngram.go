package text

import "math"

// NGram is a byte n-gram language model with interpolated absolute
// discounting (each order's counts, less a discount, plus the reserved
// mass times the next shorter order, down to uniform): a proper
// distribution and the simple baseline a neural model must beat.
type NGram struct {
	Order    int // bytes of context, at most 6
	Discount float64
	counts   map[uint64]uint32    // (order, context, next) -> count
	totals   map[uint64][2]uint32 // (order, context) -> total, distinct nexts
}

// ctxKey packs an order (<= 6) and its context bytes into 52 bits, so a
// key shifted left by 8 still has room for the next byte.
func ctxKey(order int, ctx []byte) uint64 {
	var k uint64
	for _, c := range ctx {
		k = k<<8 | uint64(c)
	}
	return uint64(order)<<48 | k
}

// NewNGram counts the n-grams of text.
func NewNGram(text []byte, order int) *NGram {
	m := &NGram{Order: order, Discount: 0.75, counts: map[uint64]uint32{}, totals: map[uint64][2]uint32{}}
	for i := range text {
		for k := 0; k <= order && k <= i; k++ {
			ck := ctxKey(k, text[i-k:i])
			key := ck<<8 | uint64(text[i])
			if m.counts[key] == 0 {
				t := m.totals[ck]
				t[1]++
				m.totals[ck] = t
			}
			m.counts[key]++
			t := m.totals[ck]
			t[0]++
			m.totals[ck] = t
		}
	}
	return m
}

// Prob is the probability of next after the context that ends text
// (using its last Order bytes).
func (m *NGram) Prob(ctx []byte, next byte) float64 {
	p := 1.0 / 256
	for k := 0; k <= m.Order && k <= len(ctx); k++ {
		ck := ctxKey(k, ctx[len(ctx)-k:])
		t, ok := m.totals[ck]
		if !ok || t[0] == 0 {
			break
		}
		c := float64(m.counts[ck<<8|uint64(next)])
		total := float64(t[0])
		p = math.Max(c-m.Discount, 0)/total + m.Discount*float64(t[1])/total*p
	}
	return p
}

// BitsPerByte is the model's mean -log2 p over text[from:], each byte
// predicted from the bytes before it.
func (m *NGram) BitsPerByte(text []byte, from int) float64 {
	var bits float64
	n := 0
	for i := max(from, 1); i < len(text); i++ {
		bits -= math.Log2(m.Prob(text[max(0, i-m.Order):i], text[i]))
		n++
	}
	if n == 0 {
		return 0
	}
	return bits / float64(n)
}
