package childproc

import (
	"fmt"
	"net"
)

// FreePorts reserves n distinct loopback ports by listening on them all at
// once, then frees them for the children. Another process could take one
// in between; the child then fails to start, and the run says so.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
