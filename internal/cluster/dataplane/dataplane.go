package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// The data plane: an item's bytes past the threshold go from the worker
// that holds them to the worker that consumes them, directly, over HTTP;
// the queue's message on JetStream carries only a reference (the holder's
// address, the item's size, and with TLS the holder's certificate's
// fingerprint). HTTP because it is made for bulk bytes: one GET streams an
// item at the wire's speed from the producer's own memory (the encoding's
// parts, not copied), with no framing of ours and no per-message limit, and
// every host has a client; the broker carries the small control messages it
// is good at.
//
// Lifetime: the producer's share keeps an item's bytes from its Send until
// the consumer has acked the item's message (then the consumer releases
// them, DELETE), never by a timer; a share that ends keeps serving until
// everything it holds is released or the run is aborted. A redelivered
// message (its consumer lost) is fetched again from the holder. A holder
// that is gone fails the consumer's fetch, and the run, naming the worker:
// the bytes are nowhere else.
//
// Protection, as the broker's: every request shows the run's data key
// (Job.DataKey, which only a holder of the cluster's token or credentials
// reads, in the job); a request without it is refused (401). Where the
// broker speaks TLS the data plane does too, with a certificate each share
// makes for itself, pinned by its fingerprint in the reference (which
// reaches the consumer over the broker's TLS).

const (
	hdrRef = "Dflow-Ref" // the item's bytes are at this data plane (host:port)
	hdrPin = "Dflow-Pin" // the holder's certificate's SHA-256, hex, with TLS
	// dataThreshold is the size past which an item's bytes take the data
	// plane (Job.DataThreshold overrides it).
	dataThreshold = 256 << 10
)

// dataPlane is one share's store of large items' bytes, and the server
// that hands them out.
type dataPlane struct {
	run, key string
	addr     string // host:port, as other hosts reach it
	pin      string // with TLS: the certificate's fingerprint
	ln       net.Listener
	srv      *http.Server
	client   *http.Client

	mu    sync.Mutex
	held  map[string]*heldItem // by item id
	bytes int64
	empty chan struct{} // closed (and renewed) whenever held empties
	// pinned are the clients that reach holders speaking TLS, one per
	// pinned certificate
	pinned map[string]*http.Client
	// reach is, by a holder's address list, which of them answered
	reach map[string]int
}

// heldItem is one item's bytes, until released, with what tells, at a
// share's end, whether its message is still waiting for a consumer.
type heldItem struct {
	parts [][]byte
	q     *jsQueue // nil in tests of the plane alone
	seq   uint64   // its message's stream sequence, once stored
	// from is the input it derives from (a restartable replica sent it):
	// settled only once these bytes are dropped, so that while a consumer
	// may still need them, the input can come back and the item be sent
	// again from another share
	from   *taken
	reheld bool // sent again after its first holder was lost (rehold)
}

// newDataPlane starts a share's data plane on host (an address other
// hosts reach this one by; "": every interface, advertised at each of this
// host's addresses, loopback first), port 0 unless host names one;
// withTLS makes it speak TLS only.
func newDataPlane(run, key, host string, withTLS bool) (*dataPlane, error) {
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "0") // a host without a port: any
	}
	ln, err := net.Listen("tcp", host)
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	addr := ln.Addr().String()
	if h, port, _ := net.SplitHostPort(host); h == "" {
		if _, port, _ = net.SplitHostPort(addr); port != "" {
			addr = strings.Join(hostAddrs(port), ",")
		}
	}
	d := &dataPlane{run: run, key: key, addr: addr, ln: ln,
		held: map[string]*heldItem{}, empty: make(chan struct{}), pinned: map[string]*http.Client{}, reach: map[string]int{}}
	close(d.empty)
	// A refused handshake (a client pinning another certificate) is the
	// client's error to report, not a line on this worker's log.
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	if withTLS {
		cert, pin, err := ephemeralCert()
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("data plane: %w", err)
		}
		d.pin = pin
		d.ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	}
	d.client = &http.Client{Transport: tr}
	go d.srv.Serve(d.ln)
	return d, nil
}

// put keeps an item's bytes until release; false when it held them
// already (the same id sent again).
func (d *dataPlane) put(id string, parts [][]byte, q *jsQueue, from *taken) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.held[id]; ok {
		return false
	}
	if len(d.held) == 0 {
		d.empty = make(chan struct{})
	}
	if from != nil {
		from.derive() // settled once dropped
	}
	d.held[id] = &heldItem{parts: parts, q: q, from: from}
	for _, p := range parts {
		d.bytes += int64(len(p))
	}
	return true
}

// stored notes the stream sequence of an item's message.
func (d *dataPlane) stored(id string, seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.held[id]; h != nil {
		h.seq = seq
	}
}

// drop releases an item's bytes.
func (d *dataPlane) drop(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.held[id]
	if !ok {
		return
	}
	delete(d.held, id)
	for _, p := range h.parts {
		d.bytes -= int64(len(p))
	}
	if len(d.held) == 0 {
		close(d.empty)
	}
	if h.from != nil && h.q != nil {
		go h.from.answered(h.q.l.ledger) // off the lock: it may settle
	}
}

// holding is how many items' bytes are held, and how many bytes.
func (d *dataPlane) holding() (int, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held), d.bytes
}

// drained waits until nothing is held, or ctx is done. Every 250ms it
// drops what no consumer will release (sweep).
func (d *dataPlane) drained(ctx context.Context) error {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		d.mu.Lock()
		empty := d.empty
		d.mu.Unlock()
		select {
		case <-empty:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			d.sweep(ctx)
		}
	}
}

// sweep drops the bytes of items whose message the stream no longer
// stores (acked: a release that did not arrive, a consumer lost between
// its ack and its release) and of items whose queue has no consumer left
// anywhere (nobody will fetch them).
func (d *dataPlane) sweep(ctx context.Context) {
	d.mu.Lock()
	type one struct {
		id string
		h  heldItem
	}
	var all []one
	for id, h := range d.held {
		all = append(all, one{id, *h})
	}
	d.mu.Unlock()
	gone := map[*jsQueue]bool{}
	for _, o := range all {
		q := o.h.q
		if q == nil || o.h.seq == 0 {
			continue
		}
		if _, ok := gone[q]; !ok {
			gone[q] = q.consumersGone(ctx, q.qi)
		}
		if gone[q] || !q.stores(ctx, o.h.seq) {
			d.drop(o.id)
		}
	}
}

func (d *dataPlane) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if d.srv.Shutdown(ctx) != nil {
		d.srv.Close()
	}
	d.client.CloseIdleConnections()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.pinned {
		c.CloseIdleConnections()
	}
}

// ServeHTTP serves /v1/RUN/ID: GET the bytes, DELETE to release them.
func (d *dataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if d.key == "" || subtle.ConstantTimeCompare([]byte(auth), []byte(d.key)) != 1 {
		http.Error(w, "dflow data plane: the run's data key is required", http.StatusUnauthorized)
		return
	}
	run, id, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	if !ok || run != d.run {
		http.Error(w, "dflow data plane: no such run", http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodDelete:
		d.drop(id)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		d.mu.Lock()
		h, ok := d.held[id]
		d.mu.Unlock()
		if !ok {
			http.Error(w, "dflow data plane: no such item (released, or never held here)", http.StatusNotFound)
			return
		}
		parts := h.parts
		n := 0
		for _, p := range parts {
			n += len(p)
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for _, p := range parts {
			if _, err := w.Write(p); err != nil {
				return
			}
		}
	default:
		http.Error(w, "dflow data plane: GET or DELETE", http.StatusMethodNotAllowed)
	}
}

// ref is where an item's bytes are held, from its message's headers.
type ref struct {
	addr, pin string
	size      int
}

func refOf(h nats.Header) (ref, bool) {
	addr := h.Get(hdrRef)
	if addr == "" {
		return ref{}, false
	}
	size, _ := strconv.Atoi(h.Get(hdrSize))
	return ref{addr: addr, pin: h.Get(hdrPin), size: size}, true
}

// url is item id's address at one of r's holder's addresses.
func (d *dataPlane) url(r ref, addr, id string) string {
	scheme := "http"
	if r.pin != "" {
		scheme = "https"
	}
	return scheme + "://" + addr + "/v1/" + url.PathEscape(d.run) + "/" + url.PathEscape(id)
}

// do sends a request for item id to r's holder, at the first of its
// addresses that takes a connection (the one that did last time first).
func (d *dataPlane) do(ctx context.Context, method string, r ref, id string) (*http.Response, error) {
	addrs := strings.Split(r.addr, ",")
	d.mu.Lock()
	if i, ok := d.reach[r.addr]; ok && i < len(addrs) {
		addrs[0], addrs[i] = addrs[i], addrs[0]
	}
	d.mu.Unlock()
	var errs []error
	for _, a := range addrs {
		req, err := http.NewRequestWithContext(ctx, method, d.url(r, a, id), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+d.key)
		resp, err := d.clientFor(r).Do(req)
		if err == nil {
			d.mu.Lock()
			d.reach[r.addr] = slices.Index(strings.Split(r.addr, ","), a)
			d.mu.Unlock()
			return resp, nil
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err) // not reachable there: the next address
	}
	return nil, errors.Join(errs...)
}

// clientFor is the client that reaches r's holder: with TLS, one that
// accepts only the certificate r pins (one client a pin, kept).
func (d *dataPlane) clientFor(r ref) *http.Client {
	if r.pin == "" {
		return d.client
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.pinned[r.pin]; c != nil {
		return c
	}
	tr := d.client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, // the pin below is the check
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			if sum := sha256.Sum256(raw[0]); hex.EncodeToString(sum[:]) != r.pin {
				return errors.New("the holder's certificate is not the one its reference pins")
			}
			return nil
		}}
	c := &http.Client{Transport: tr}
	d.pinned[r.pin] = c
	return c
}

// fetch gets an item's bytes from its holder.
func (d *dataPlane) fetch(ctx context.Context, r ref, id string) ([]byte, error) {
	resp, err := d.do(ctx, http.MethodGet, r, id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	data := make([]byte, r.size)
	if _, err := io.ReadFull(resp.Body, data); err != nil {
		return nil, fmt.Errorf("reading %d bytes: %w", r.size, err)
	}
	return data, nil
}

// release tells an item's holder it may drop the bytes, trying three
// times; a holder gone has dropped them already, and one that does not
// hear finds at its end that the stream no longer stores the message
// (sweep).
func (d *dataPlane) release(ctx context.Context, r ref, id string) {
	for try := range 3 {
		if d.releaseOnce(ctx, r, id) || ctx.Err() != nil {
			return
		}
		select {
		case <-time.After(time.Duration(try+1) * 200 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func (d *dataPlane) releaseOnce(ctx context.Context, r ref, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := d.do(ctx, http.MethodDelete, r, id)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// ephemeralCert makes a share's TLS certificate and its fingerprint.
func ephemeralCert() (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Minute),
		NotAfter: time.Now().Add(30 * 24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	sum := sha256.Sum256(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, hex.EncodeToString(sum[:]), nil
}

// dataHost is the address other hosts reach this one by: the local end
// of a route to the broker (nothing is sent). A worker that reaches the
// broker on loopback may still serve workers on other hosts (which reach
// the broker at this host's address): "" then, every interface.
func dataHost(nc *nats.Conn) string {
	u, err := url.Parse(nc.ConnectedUrl())
	if err != nil || u.Hostname() == "" {
		return ""
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsLoopback() || u.Hostname() == "localhost" {
		return ""
	}
	c, err := net.Dial("udp", net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "4222")))
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// hostAddrs are host:port at loopback, then at each of this host's
// addresses other than loopback and link-local.
func hostAddrs(port string) []string {
	out := []string{net.JoinHostPort("127.0.0.1", port)}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && !n.IP.IsLinkLocalMulticast() {
			out = append(out, net.JoinHostPort(n.IP.String(), port))
		}
	}
	return out
}

// A large item sent again after a loss.
//
// An item a restartable replica sent from an input lives on its holder's
// data plane until a consumer releases it, and the input is settled only
// then (heldItem.from). If the holder is lost first, the input comes back
// and the replica that does it again sends the item again: the broker
// answers that it is a duplicate of the message that stands, whose bytes
// are gone. The new copy is kept (rehold) and its address recorded under
// the item's id in the run's holder bucket; a consumer that cannot fetch
// from the first holder looks there (fetchAgain). The copy is dropped once
// the stream no longer stores the message (sweepReheld), like any other.

// rehold keeps the bytes of id, sent again, for the message that stands,
// and records where they are.
func (q *jsQueue) rehold(id string) {
	d := q.l.dp
	d.mu.Lock()
	if h := d.held[id]; h != nil {
		h.reheld = true
	}
	d.mu.Unlock()
	b, _ := json.Marshal(holderRef{Addr: d.addr, Pin: d.pin, Worker: q.l.worker})
	ctx, cancel := context.WithTimeout(q.l.runCtx(), 5*time.Second)
	defer cancel()
	if _, err := q.l.holders.Put(ctx, id, b); err != nil && q.l.fatal != nil && !q.l.aborting() {
		q.l.fatal(fmt.Errorf("%s: recording where item %s is held again: %w", q.name(), id, err))
	}
}

// holderRef is a holder bucket's entry.
type holderRef struct {
	Addr   string `json:"addr"`
	Pin    string `json:"pin,omitempty"`
	Worker string `json:"worker"`
}

// sweepReheld drops q's reheld bytes whose message the stream no longer
// stores.
func (d *dataPlane) sweepReheld(q *jsQueue) {
	d.mu.Lock()
	var look map[string]uint64
	for id, h := range d.held {
		if h.reheld && h.q == q && h.seq != 0 {
			if look == nil {
				look = map[string]uint64{}
			}
			look[id] = h.seq
		}
	}
	d.mu.Unlock()
	for id, seq := range look {
		if !q.stores(q.l.stopCtx, seq) {
			d.drop(id)
		}
	}
}

// fetchAgain fetches the bytes of id from where they are held again after
// their first holder was lost (rehold), waiting for the input they derive
// from to come back and be done again, for as long as a duplicate can be
// dropped (2 minutes) or until ctx ends. It returns the new place, so
// that the release goes there.
func (q *jsQueue) fetchAgain(ctx context.Context, r ref, id string) ([]byte, ref, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if e, err := q.l.holders.Get(ctx, id); err == nil {
			var h holderRef
			if json.Unmarshal(e.Value(), &h) == nil && h.Addr != r.addr {
				nr := ref{addr: h.Addr, pin: h.Pin, size: r.size}
				if data, err := q.l.dp.fetch(ctx, nr, id); err == nil {
					return data, nr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, r, ctx.Err()
		case <-time.After(wait):
		}
	}
}
