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
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
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
	held  map[string][][]byte // item id -> its encoding's parts
	bytes int64
	empty chan struct{} // closed (and renewed) whenever held empties
}

// newDataPlane starts a share's data plane on host (an address other
// hosts reach this one by), port 0 unless host names one; withTLS makes it
// speak TLS only.
func newDataPlane(run, key, host string, withTLS bool) (*dataPlane, error) {
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "0") // a host without a port: any
	}
	ln, err := net.Listen("tcp", host)
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	d := &dataPlane{run: run, key: key, addr: ln.Addr().String(), ln: ln,
		held: map[string][][]byte{}, empty: make(chan struct{})}
	close(d.empty)
	// A refused handshake (a client pinning another certificate) is the
	// client's error to report, not a line on this worker's log.
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
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

// put keeps an item's bytes until release.
func (d *dataPlane) put(id string, parts [][]byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.held[id]; ok {
		return // sent again (a restart): the same bytes
	}
	if len(d.held) == 0 {
		d.empty = make(chan struct{})
	}
	d.held[id] = parts
	for _, p := range parts {
		d.bytes += int64(len(p))
	}
}

// drop releases an item's bytes.
func (d *dataPlane) drop(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	parts, ok := d.held[id]
	if !ok {
		return
	}
	delete(d.held, id)
	for _, p := range parts {
		d.bytes -= int64(len(p))
	}
	if len(d.held) == 0 {
		close(d.empty)
	}
}

// holding is how many items' bytes are held, and how many bytes.
func (d *dataPlane) holding() (int, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held), d.bytes
}

// drained waits until nothing is held, or ctx is done.
func (d *dataPlane) drained(ctx context.Context) error {
	d.mu.Lock()
	empty := d.empty
	d.mu.Unlock()
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *dataPlane) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d.srv.Shutdown(ctx)
	d.client.CloseIdleConnections()
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
		parts, ok := d.held[id]
		d.mu.Unlock()
		if !ok {
			http.Error(w, "dflow data plane: no such item (released, or never held here)", http.StatusNotFound)
			return
		}
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

func (d *dataPlane) url(r ref, id string) string {
	scheme := "http"
	if r.pin != "" {
		scheme = "https"
	}
	return scheme + "://" + r.addr + "/v1/" + url.PathEscape(d.run) + "/" + url.PathEscape(id)
}

// clientFor is the client that reaches r's holder: with TLS, one that
// accepts only the certificate r pins.
func (d *dataPlane) clientFor(r ref) *http.Client {
	if r.pin == "" {
		return d.client
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
	return &http.Client{Transport: tr}
}

// fetch gets an item's bytes from its holder.
func (d *dataPlane) fetch(ctx context.Context, r ref, id string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url(r, id), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	resp, err := d.clientFor(r).Do(req)
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

// release tells an item's holder it may drop the bytes; a holder gone
// has dropped them already.
func (d *dataPlane) release(r ref, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, d.url(r, id), nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	if resp, err := d.clientFor(r).Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
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
// of a route to the broker (nothing is sent), loopback when the broker
// is local.
func dataHost(nc *nats.Conn) string {
	u, err := url.Parse(nc.ConnectedUrl())
	if err != nil || u.Hostname() == "" {
		return "127.0.0.1"
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsLoopback() || u.Hostname() == "localhost" {
		return "127.0.0.1"
	}
	c, err := net.Dial("udp", net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "4222")))
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}
