package localpg

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on, chosen below the
// kernel's ephemeral port range. A cluster binds its port only after initdb, a second
// or more after the port was chosen; a port from the ephemeral range (what port 0
// gives) can meanwhile become the local port of any outbound connection, such as
// the tests' connections to other clusters (make test failed so once). Below the
// range only a listener that chose the same port can take it.
func FreePort() (int, error) {
	low := 32768 // Linux's default start of net.ipv4.ip_local_port_range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 {
			low = lo
		}
	}
	const first = 10000
	if low <= first+1000 {
		return 0, fmt.Errorf("localpg: the ephemeral port range starts at %d: no room below it for a free port", low)
	}
	for range 100 {
		port := first + rand.IntN(low-first)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			return 0, err
		}
		return port, nil
	}
	return 0, errors.New("localpg: no free port found below the ephemeral range in 100 tries")
}
