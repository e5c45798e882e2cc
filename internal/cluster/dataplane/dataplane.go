package dataplane

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

const (
	HdrRef  = "Dflow-Ref"  // the item's bytes are at this data plane (host:port)
	HdrPin  = "Dflow-Pin"  // the holder's certificate's SHA-256, hex, with TLS
	HdrSize = "Dflow-Size" // the item's bytes, on the data plane
	// Threshold is the size past which an item's bytes take the data
	// plane (Job.DataThreshold overrides it).
	Threshold = 256 << 10
)

// Queue is the queue a held item's message is on: what tells, at a
// share's end, whether a consumer may still fetch the item.
type Queue interface {
	// Stores says whether the queue's stream still stores the message at
	// seq (not yet acked).
	Stores(ctx context.Context, seq uint64) bool
	// NoConsumers says whether the queue has no consumer left anywhere.
	NoConsumers(ctx context.Context) bool
}

// Input is the input a held item derives from: it is settled only once
// the item's bytes are dropped (Derived when put, Answered when dropped).
type Input interface {
	Derived()
	Answered()
}

// Plane is one share's store of large items' bytes, and the server
// that hands them out.
type Plane struct {
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
	// served is closed once the server's goroutine has returned
	served chan struct{}
}

// heldItem is one item's bytes, until released, with what tells, at a
// share's end, whether its message is still waiting for a consumer.
type heldItem struct {
	parts [][]byte
	q     Queue  // nil in tests of the plane alone
	seq   uint64 // its message's stream sequence, once stored
	// from is the input it derives from (a restartable replica sent it):
	// settled only once these bytes are dropped, so that while a consumer
	// may still need them, the input can come back and the item be sent
	// again from another share
	from   Input
	reheld bool // sent again after its first holder was lost (Rehold)
}

// New starts a share's data plane on host (an address other
// hosts reach this one by; "": every interface, advertised at each of this
// host's addresses, loopback first), port 0 unless host names one;
// withTLS makes it speak TLS only.
func New(run, key, host string, withTLS bool) (*Plane, error) {
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
	d := &Plane{run: run, key: key, addr: addr, ln: ln, served: make(chan struct{}),
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
	go func() {
		defer close(d.served)
		d.srv.Serve(d.ln)
	}()
	return d, nil
}

// Addr is where other hosts reach the plane: host:port, or several,
// comma-separated, loopback first.
func (d *Plane) Addr() string { return d.addr }

// Pin is, with TLS, the fingerprint of the plane's certificate ("" without).
func (d *Plane) Pin() string { return d.pin }

// Key is the run's data key, which every request shows.
func (d *Plane) Key() string { return d.key }

// Put keeps an item's bytes until they are released (Drop); false when it
// held them already (the same id sent again). from, if not nil, is the
// input the item derives from: Derived now, Answered once the bytes are
// dropped.
func (d *Plane) Put(id string, parts [][]byte, q Queue, from Input) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.held[id]; ok {
		return false
	}
	if len(d.held) == 0 {
		d.empty = make(chan struct{})
	}
	if from != nil {
		from.Derived() // settled once dropped
	}
	d.held[id] = &heldItem{parts: parts, q: q, from: from}
	for _, p := range parts {
		d.bytes += int64(len(p))
	}
	return true
}

// Stored notes the stream sequence of an item's message.
func (d *Plane) Stored(id string, seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.held[id]; h != nil {
		h.seq = seq
	}
}

// Drop releases an item's bytes; the input they derive from, if any, is
// Answered, on the caller's goroutine, after the plane's lock is let go
// (it may settle).
func (d *Plane) Drop(id string) {
	d.mu.Lock()
	h, ok := d.held[id]
	if !ok {
		d.mu.Unlock()
		return
	}
	delete(d.held, id)
	for _, p := range h.parts {
		d.bytes -= int64(len(p))
	}
	if len(d.held) == 0 {
		close(d.empty)
	}
	d.mu.Unlock()
	if h.from != nil && h.q != nil {
		h.from.Answered()
	}
}

// Holding is how many items' bytes are held, and how many bytes.
func (d *Plane) Holding() (int, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held), d.bytes
}

// Drained waits until nothing is held, or ctx is done. Every 250ms it
// drops what no consumer will release (sweep).
func (d *Plane) Drained(ctx context.Context) error {
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
func (d *Plane) sweep(ctx context.Context) {
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
	gone := map[Queue]bool{}
	for _, o := range all {
		q := o.h.q
		if q == nil || o.h.seq == 0 {
			continue
		}
		if _, ok := gone[q]; !ok {
			gone[q] = q.NoConsumers(ctx)
		}
		if gone[q] || !q.Stores(ctx, o.h.seq) {
			d.Drop(o.id)
		}
	}
}

// Close stops the plane's server (what it holds is not served any more)
// and waits for its goroutine to return.
func (d *Plane) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if d.srv.Shutdown(ctx) != nil {
		d.srv.Close()
	}
	<-d.served
	d.client.CloseIdleConnections()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.pinned {
		c.CloseIdleConnections()
	}
}

// ServeHTTP serves /v1/RUN/ID: GET the bytes, DELETE to release them.
func (d *Plane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		d.Drop(id)
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

// Ref is where an item's bytes are held, from its message's headers.
type Ref struct {
	Addr string // the holder's addresses, comma-separated
	Pin  string // with TLS, the holder's certificate's fingerprint
	Size int    // the item's bytes
}

// RefOf is the reference in a message's headers; false when its item's
// bytes are in the message.
func RefOf(h nats.Header) (Ref, bool) {
	addr := h.Get(HdrRef)
	if addr == "" {
		return Ref{}, false
	}
	size, _ := strconv.Atoi(h.Get(HdrSize))
	return Ref{Addr: addr, Pin: h.Get(HdrPin), Size: size}, true
}

// url is item id's address at one of r's holder's addresses.
func (d *Plane) url(r Ref, addr, id string) string {
	scheme := "http"
	if r.Pin != "" {
		scheme = "https"
	}
	return scheme + "://" + addr + "/v1/" + url.PathEscape(d.run) + "/" + url.PathEscape(id)
}

// do sends a request for item id to r's holder, at the first of its
// addresses that takes a connection (the one that did last time first).
func (d *Plane) do(ctx context.Context, method string, r Ref, id string) (*http.Response, error) {
	addrs := strings.Split(r.Addr, ",")
	d.mu.Lock()
	if i, ok := d.reach[r.Addr]; ok && i < len(addrs) {
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
			d.reach[r.Addr] = slices.Index(strings.Split(r.Addr, ","), a)
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
func (d *Plane) clientFor(r Ref) *http.Client {
	if r.Pin == "" {
		return d.client
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.pinned[r.Pin]; c != nil {
		return c
	}
	tr := d.client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, // the pin below is the check
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			if sum := sha256.Sum256(raw[0]); hex.EncodeToString(sum[:]) != r.Pin {
				return errors.New("the holder's certificate is not the one its reference pins")
			}
			return nil
		}}
	c := &http.Client{Transport: tr}
	d.pinned[r.Pin] = c
	return c
}

// Fetch gets an item's bytes from its holder.
func (d *Plane) Fetch(ctx context.Context, r Ref, id string) ([]byte, error) {
	resp, err := d.do(ctx, http.MethodGet, r, id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	data := make([]byte, r.Size)
	if _, err := io.ReadFull(resp.Body, data); err != nil {
		return nil, fmt.Errorf("reading %d bytes: %w", r.Size, err)
	}
	return data, nil
}

// Release tells an item's holder it may drop the bytes, trying three
// times; a holder gone has dropped them already, and one that does not
// hear finds at its end that the stream no longer stores the message
// (sweep).
func (d *Plane) Release(ctx context.Context, r Ref, id string) {
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

func (d *Plane) releaseOnce(ctx context.Context, r Ref, id string) bool {
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

// Host is the address other hosts reach this one by: the local end
// of a route to the broker (nothing is sent). A worker that reaches the
// broker on loopback may still serve workers on other hosts (which reach
// the broker at this host's address): "" then, every interface.
func Host(nc *nats.Conn) string {
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

// Rehold marks id's bytes as held again, for a message that stands after
// their first holder was lost: the copy is dropped once the stream no
// longer stores the message (SweepReheld).
func (d *Plane) Rehold(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.held[id]; h != nil {
		h.reheld = true
	}
}

// HolderRef is an entry of the run's holder bucket: where an item's bytes
// are held again.
type HolderRef struct {
	Addr   string `json:"addr"`
	Pin    string `json:"pin,omitempty"`
	Worker string `json:"worker"`
}

// SweepReheld drops q's reheld bytes whose message the stream no longer
// stores.
func (d *Plane) SweepReheld(ctx context.Context, q Queue) {
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
		if !q.Stores(ctx, seq) {
			d.Drop(id)
		}
	}
}
