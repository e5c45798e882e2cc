package graph

import (
	"errors"
	"fmt"
	"strings"
)

// Policy is how an edge spreads items from producer to consumer replicas.
// A Policy is a value, written as a spec names it ("round_robin"), whose
// methods do both halves of the job, for the runtime and the simulator
// alike:
//
//   - Wire computes the edge's queues: which producer replicas push to
//     each queue and which consumer replicas pull from it (Edge.Queues).
//   - Router returns, for one producer replica, what picks the queue each
//     item it sends goes to.
//
// The policies are Policies: RoundRobin, Shared and KeyHash. A Policy is
// an EdgeOption (b.Edge("hs", "a.out", "b.in", graph.Shared)) and
// compares as its name. Adding a policy is adding one value to the list
// behind Policies (a type with the methods of policyImpl) and its
// paragraph to docs/policies.md: the loader, --set, validation's hint,
// the renderers, the engine and the simulator all go through these
// methods.
//
// What an implementation guarantees: Wire(p, c) for p, c >= 1 returns
// queues indexed 0..n-1, every producer in at least one queue's Producers
// and every consumer in exactly one queue's Consumers (both ascending);
// Router(e, p) for an edge e wired by the same policy returns nil when
// producer p has one queue and every item goes to it whatever it is (the
// runtime then skips routing: its fast path), else a Router answering
// positions into e.ProducerQueues(p); the same items in the same order
// get the same positions on every run and machine.
type Policy string

// The edge policies.
const (
	// RoundRobin gives each consumer replica a queue of its own: with P
	// producers and C consumers, producer p feeds consumer p mod C when
	// P >= C; when P < C consumer c is fed by producer c mod P and each
	// producer rotates its items over its consumers.
	RoundRobin Policy = "round_robin"
	// Shared is one queue: every producer pushes, every consumer pulls,
	// first come first served.
	Shared Policy = "shared"
	// KeyHash gives each consumer replica a queue of its own, fed by
	// every producer; an item goes to consumer KeyHashOf(key) mod C,
	// where key is the item's key (an item implementing
	// interface{ Key() string }, nodes.Keyed, with a non-empty key). An
	// item without one fails the send with an error wrapping ErrNoKey.
	KeyHash Policy = "key_hash"
)

// policyImpl is one policy's behaviour; impls lists them, in the order
// Policies and hints give them.
type policyImpl interface {
	name() Policy
	wire(p, c int) []Queue
	router(e *Edge, p int) Router
	// wiring describes an edge's wiring in a few words for the renderers'
	// labels ("2-2-1"), or "" when there is nothing to say.
	wiring(e *Edge) string
}

var impls = []policyImpl{roundRobin{}, shared{}, keyHash{}}

// Policies lists the known policies.
var Policies = func() []Policy {
	ps := make([]Policy, len(impls))
	for i, im := range impls {
		ps[i] = im.name()
	}
	return ps
}()

// DefaultPolicy is an edge's policy when the spec gives none.
const DefaultPolicy = Shared

// A Router routes the items one producer replica sends on one edge.
type Router interface {
	// Route returns the queue item goes to, as a position in
	// Edge.ProducerQueues(p) of the router's producer p, or an error that
	// fails the send (KeyHash's for an item without a key).
	Route(item any) (int, error)
}

func (p Policy) impl() policyImpl {
	for _, im := range impls {
		if im.name() == p {
			return im
		}
	}
	return nil
}

// Name is the policy as a spec writes it.
func (p Policy) Name() string { return string(p) }

// Known reports whether p is one of Policies.
func (p Policy) Known() bool { return p.impl() != nil }

// check is nil for a known policy, else the error saying it is not known
// and listing every policy (with the closest name).
func (p Policy) check() error {
	if p.Known() {
		return nil
	}
	return fmt.Errorf("policy %q is not known%s", string(p), hinted(DidYouMean(string(p), PolicyNames()), " The policies are "+PolicyList()+"."))
}

// Wire computes the queues of an edge with policy p between producers
// and consumers replicas (nil when either is below 1, or p is not known).
func (p Policy) Wire(producers, consumers int) []Queue {
	im := p.impl()
	if producers < 1 || consumers < 1 || im == nil {
		return nil
	}
	return im.wire(producers, consumers)
}

// Router returns a new router for producer replica i of edge e (wired by
// p), or nil when i's every item goes to its only queue. A Router is used
// by one goroutine, its producer's; each call makes a new one. It panics
// on a policy that is not known (a built Graph has none).
func (p Policy) Router(e *Edge, i int) Router {
	im := p.impl()
	if im == nil {
		panic(fmt.Sprintf("graph: edge %q: %v", e.Name, p.check()))
	}
	return im.router(e, i)
}

func (p Policy) applyEdge(d *edgeDraft) { d.policy, d.policyGiven = p, true }

// PolicyNames returns the names of Policies, in order.
func PolicyNames() []string {
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = p.Name()
	}
	return names
}

// PolicyList writes the names of Policies for a sentence:
// `"round_robin", "shared" and "key_hash"`.
func PolicyList() string {
	q := make([]string, len(Policies))
	for i, p := range Policies {
		q[i] = fmt.Sprintf("%q", p.Name())
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

// Wire computes the queues of an edge with the given policy between p
// producer and c consumer replicas: policy.Wire(p, c).
func Wire(policy Policy, p, c int) []Queue { return policy.Wire(p, c) }

// perConsumer is one queue per consumer replica, each with no producer yet.
func perConsumer(c int) []Queue {
	qs := make([]Queue, c)
	for j := range qs {
		qs[j] = Queue{Index: j, Consumers: []int{j}}
	}
	return qs
}

type roundRobin struct{}

func (roundRobin) name() Policy                 { return RoundRobin }
func (roundRobin) router(e *Edge, p int) Router { return rotate(len(e.ProducerQueues(p))) }

// Wire: p >= c, producer i feeds consumer i mod c (5 on 3 gives producers
// {0,3}, {1,4}, {2}); p < c, consumer j is fed by producer j mod p.
func (roundRobin) wire(p, c int) []Queue {
	qs := perConsumer(c)
	if p < c {
		for j := range qs {
			qs[j].Producers = []int{j % p}
		}
		return qs
	}
	for i := 0; i < p; i++ {
		qs[i%c].Producers = append(qs[i%c].Producers, i)
	}
	return qs
}

func (roundRobin) wiring(e *Edge) string {
	if len(e.Queues) > 1 {
		return e.Fanin()
	}
	return ""
}

type shared struct{}

func (shared) name() Policy                 { return Shared }
func (shared) router(e *Edge, p int) Router { return rotate(len(e.ProducerQueues(p))) }
func (shared) wiring(*Edge) string          { return "" }

func (shared) wire(p, c int) []Queue {
	return []Queue{{Index: 0, Producers: seq(p), Consumers: seq(c)}}
}

// rotation is the router of a producer over n queues in turn (round_robin
// with fewer producers than consumers): the one implementation of
// rotation, used by the runtime and the simulator.
type rotation struct{ n, next int }

// rotate returns a rotation over n queues, or nil (no routing) for one.
func rotate(n int) Router {
	if n <= 1 {
		return nil
	}
	return &rotation{n: n}
}

// Route returns the next queue in turn.
func (r *rotation) Route(any) (int, error) {
	i := r.next
	if r.next++; r.next == r.n {
		r.next = 0
	}
	return i, nil
}

type keyHash struct{}

func (keyHash) name() Policy { return KeyHash }

// Wire: one queue per consumer, every producer feeding every queue.
func (keyHash) wire(p, c int) []Queue {
	qs := perConsumer(c)
	for j := range qs {
		qs[j].Producers = seq(p)
	}
	return qs
}

// Router always routes, even over one queue: an item without a key is an
// error on every key_hash edge, whatever its consumer count.
func (keyHash) router(e *Edge, p int) Router {
	return &keyRouter{edge: e, producer: p, n: uint64(len(e.ProducerQueues(p)))}
}

func (keyHash) wiring(e *Edge) string { return fmt.Sprintf("hash(key) mod %d", len(e.Queues)) }

// ErrNoKey is the error (wrapped) of a send of an item without a key on a
// key_hash edge.
var ErrNoKey = errors.New("item has no key")

type keyRouter struct {
	edge     *Edge
	producer int
	n        uint64
}

func (r *keyRouter) Route(item any) (int, error) {
	if k, ok := item.(interface{ Key() string }); ok {
		if key := k.Key(); key != "" {
			return int(KeyHashOf(key) % r.n), nil
		}
	}
	return 0, fmt.Errorf("edge %q (key_hash): stage %q replica %d sent a %T: %w; a key_hash edge routes each item by its key, "+
		"so the item must implement nodes.Keyed with a non-empty Key", r.edge.Name, r.edge.From.Stage.Name, r.producer, item, ErrNoKey)
}

// KeyHashOf is the hash KeyHash routes by: FNV-1a 64 of the key's bytes
// (the constants of the FNV specification, so the same key picks the same
// consumer on every run, machine and Go version).
func KeyHashOf(key string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return h
}

// KeyConsumer is the consumer replica, of c, that KeyHash sends key to.
func KeyConsumer(key string, c int) int { return int(KeyHashOf(key) % uint64(c)) }
