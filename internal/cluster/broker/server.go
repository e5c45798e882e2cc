package broker

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerOptions configure the embedded NATS server.
type ServerOptions struct {
	// Addr is HOST:PORT to listen on; "" is 127.0.0.1 on a free port, and a
	// HOST left empty (":4222") is loopback: nothing listens beyond this
	// machine unless told so (0.0.0.0:4222).
	Addr string
	// Token is required of every client. Empty makes one up (NewToken).
	Token string
	// TLSCert and TLSKey, both set, make the server speak TLS only.
	TLSCert, TLSKey string
	// StoreDir holds JetStream's files; "" is a temporary folder removed
	// at Shutdown.
	StoreDir string
}

// Server is an embedded NATS server with JetStream.
type Server struct {
	s     *server.Server
	URL   string
	Token string
	tmp   string
}

// APIRequests is how many JetStream API requests the server has answered
// (what a client's reads of a queue's state cost it).
func (s *Server) APIRequests() (uint64, error) {
	js, err := s.s.Jsz(nil)
	if err != nil {
		return 0, err
	}
	return js.API.Total, nil
}

// NewToken makes up a random token.
func NewToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// StartServer starts an embedded server and waits until it is ready.
func StartServer(o ServerOptions) (*Server, error) {
	host, port := "127.0.0.1", -1
	if o.Addr != "" {
		h, p, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return nil, fmt.Errorf("server address %q: %v", o.Addr, err)
		}
		if h != "" {
			host = h
		}
		if port, err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("server address %q: bad port", o.Addr)
		}
		if port == 0 {
			port = -1 // any free port (nats-server reads 0 as its default, 4222)
		}
	}
	if o.Token == "" {
		o.Token = NewToken()
	}
	srv := &Server{Token: o.Token}
	dir := o.StoreDir
	if dir == "" {
		d, err := os.MkdirTemp("", "dflow-js-")
		if err != nil {
			return nil, err
		}
		dir, srv.tmp = d, d
	}
	opts := &server.Options{
		Host: host, Port: port, Authorization: o.Token,
		JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
		ServerName: "dflow",
	}
	scheme := "nats"
	if o.TLSCert != "" || o.TLSKey != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			srv.cleanup()
			return nil, fmt.Errorf("TLS: %v", err)
		}
		opts.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		opts.TLS = true
		scheme = "tls"
	}
	s, err := server.NewServer(opts)
	if err != nil {
		srv.cleanup()
		return nil, fmt.Errorf("NATS server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		srv.cleanup()
		return nil, errors.New("NATS server: not ready after 10s")
	}
	addr := s.Addr().(*net.TCPAddr)
	h := host
	if h == "0.0.0.0" || h == "::" {
		h = "127.0.0.1"
	}
	srv.s, srv.URL = s, fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(h, strconv.Itoa(addr.Port)))
	return srv, nil
}

// Shutdown stops the server and removes its temporary store.
func (s *Server) Shutdown() {
	s.s.Shutdown()
	s.s.WaitForShutdown()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
	}
}

// ConnOptions say how to reach a cluster's server.
type ConnOptions struct {
	URL   string
	Token string
	// Creds is a NATS credentials file (a user's JWT and seed), for a
	// server of one's own that runs in operator mode; not with Token.
	Creds string
	// CA is a PEM file of the CA that signed the server's TLS certificate
	// (a tls:// URL); empty uses the system's roots.
	CA string
	// Name is the client's name, as the server lists it.
	Name string
	// OnClosed, if set, is called once the connection is closed for good
	// (the server gone past reconnecting).
	OnClosed func()
	// Log, if set, gets a line when the connection is cut (the server's
	// reason: a slow consumer, say) and when it is back: a lease missed
	// meanwhile is then explained.
	Log io.Writer
}

// Connect connects to a cluster's server, and says in words why not when
// it cannot: no server there, or the token refused.
func Connect(o ConnOptions) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(o.Name),
		nats.MaxReconnects(10), nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(5 * time.Second)}
	switch {
	case o.Creds != "" && o.Token != "":
		return nil, errors.New("give the cluster's token or a credentials file, not both")
	case o.Creds != "":
		if _, err := os.Stat(o.Creds); err != nil {
			return nil, fmt.Errorf("credentials file: %v", err)
		}
		opts = append(opts, nats.UserCredentials(o.Creds))
	default:
		opts = append(opts, nats.Token(o.Token))
	}
	if o.CA != "" {
		opts = append(opts, nats.RootCAs(o.CA))
	}
	if strings.HasPrefix(o.URL, "tls://") && o.CA == "" {
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	if o.OnClosed != nil {
		opts = append(opts, nats.ClosedHandler(func(*nats.Conn) { o.OnClosed() }))
	}
	if o.Log != nil {
		opts = append(opts,
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					fmt.Fprintf(o.Log, "%s: the connection to %s was cut (%v): reconnecting\n", o.Name, o.URL, err)
				}
			}),
			nats.ReconnectHandler(func(*nats.Conn) { fmt.Fprintf(o.Log, "%s: reconnected to %s\n", o.Name, o.URL) }))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, explain(o, err)
	}
	return nc, nil
}

func explain(o ConnOptions, err error) error {
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization"):
		what := "no token or credentials file was given"
		switch {
		case o.Creds != "":
			what = "it did not accept the credentials in " + o.Creds
		case o.Token != "":
			what = "the token given is not the cluster's"
		}
		return fmt.Errorf("the cluster at %s refused the connection: %s (give the cluster's token with --token or DFLOW_CLUSTER_TOKEN, or a NATS credentials file with --creds or DFLOW_CLUSTER_CREDS)", o.URL, what)
	case errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("no cluster server answers at %s (is the coordinator's or nats-server running, and the URL right?): %v", o.URL, err)
	case isTimeout(err):
		return fmt.Errorf("nothing at %s answered as a NATS server in time (a firewall dropping the packets, or another service on that port?): %v", o.URL, err)
	}
	return fmt.Errorf("cannot connect to the cluster at %s: %v", o.URL, err)
}

// isTimeout says whether err is a network wait that ran out: a peer that
// accepted the connection and never spoke, or packets dropped on the way.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || errors.Is(err, nats.ErrTimeout)
}
