// Package netport picks the TCP port a group's rank 0 listens on
// (MASTER_PORT), which the ranks learn before rank 0 binds it.
package netport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Free returns a TCP port that nothing listens on at host now (host ""
// is every interface), picked at random below the range the kernel hands
// out to outgoing connections and to listeners on port 0: a port taken
// from that range, found free and closed, could be handed to another
// process's listener or connection before rank 0 binds it, and a rank
// that reached such a listener would wait on it past any timeout.
func Free(host string) (int, error) {
	lo, hi := 10000, ephemeralLow()-1
	if hi <= lo {
		lo, hi = 1024, max(hi, 1025)
	}
	var last error
	for range 64 {
		port := lo + rand.IntN(hi-lo+1)
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port found between %d and %d: %w", lo, hi, last)
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux's
// ip_local_port_range; 32768, its default, where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 1024 {
		return 32768
	}
	return n
}
