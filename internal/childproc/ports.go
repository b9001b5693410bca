package childproc

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// Ports are drawn from [lowestPort, ephemeralPort): below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range starts at 32768), from
// which the kernel hands out ports for ":0" listeners and for connections'
// local ends. A port the kernel handed out once is free only until it hands
// it out again, to this process or another: two make test runs at once saw
// a child's /readyz answered 404 by another run's server on its port. Only
// draws like these use the range below.
const (
	lowestPort    = 20000
	ephemeralPort = 32768
)

// FreePorts reserves n distinct loopback ports by listening on them all at
// once, then frees them for the children. Another process drawing the same
// way could take one in between; the child then fails to start, and the run
// says so.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for draws := 0; len(ports) < n; draws++ {
		if draws == 100*n {
			return nil, fmt.Errorf("finding %d free ports on 127.0.0.1 in [%d, %d): %d draws found %d", n, lowestPort, ephemeralPort, draws, len(ports))
		}
		port := lowestPort + rand.IntN(ephemeralPort-lowestPort)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		defer l.Close()
		ports = append(ports, port)
	}
	return ports, nil
}
