package broker

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// TestServerAnyPort: an address with port 0 takes a free port, as
// `dflow run --serve 127.0.0.1:0` asks, not nats-server's default 4222;
// two such servers start side by side.
func TestServerAnyPort(t *testing.T) {
	t.Parallel()
	var urls []string
	for range 2 {
		srv, err := StartServer(ServerOptions{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		if strings.HasSuffix(srv.URL, ":4222") {
			t.Errorf("port 0 listened on nats-server's default: %s", srv.URL)
		}
		urls = append(urls, srv.URL)
	}
	if urls[0] == urls[1] {
		t.Errorf("two servers on one address: %v", urls)
	}
}

// TestConnectSilentPeer: a peer that takes the connection and never
// speaks (another service on the port, say) is said to be so, not a bare
// read error.
func TestConnectSilentPeer(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var held []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	url := "nats://" + l.Addr().String()
	_, err = Connect(ConnOptions{URL: url, Token: "t"})
	if err == nil || !strings.Contains(err.Error(), "nothing at "+url+" answered as a NATS server in time") {
		t.Errorf("connecting to a silent peer: %v", err)
	}
}
