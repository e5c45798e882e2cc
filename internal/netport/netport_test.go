package netport

import (
	"net"
	"strconv"
	"testing"
)

// TestFree: the port is free (it can be bound at once) and below the
// kernel's ephemeral range, where no listener on port 0 and no outgoing
// connection is given it.
func TestFree(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		port, err := Free("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if port >= low || port < 1024 {
			t.Fatalf("port %d: want one in [1024, %d)", port, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d, said free: %v", port, err)
		}
		l.Close()
	}
}
