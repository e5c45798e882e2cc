package broker

import (
	"strings"
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
