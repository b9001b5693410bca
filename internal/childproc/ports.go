package childproc

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
)

// Ports are drawn from [lowestPort, ephemeralPort): below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range starts at 32768), from
// which the kernel hands out ports for ":0" listeners and for connections'
// local ends. A port the kernel handed out once is free only until it hands
// it out again, to this process or another: two make test runs at once saw
// a child's /readyz answered 404 by another run's server on its port.
//
// A port checked free is free only until someone binds it, and the child
// binds it some time after FreePorts returns. So that no two draws can meet
// in that gap, the range is cut into blocks of blockSize ports, and a
// process draws only from blocks it holds: a block is held by an exclusive
// lock on its file under os.TempDir()/kshard-ports, which the kernel drops
// when the process exits however it exits, and within the process a port is
// handed out once before any is handed out again.
const (
	lowestPort    = 20000
	ephemeralPort = 32768
	blockSize     = 64
	blocks        = (ephemeralPort - lowestPort) / blockSize
	// maxBlocks is as many blocks as a process takes before it goes round
	// the ones it holds again, handing out ports it handed out long ago
	// (those its children still listen on are skipped): a long run must
	// not take the blocks of the runs beside it.
	maxBlocks = 4
)

// portBlocks are the blocks this process holds, in the order it took
// them, and the next port to hand out.
var portBlocks struct {
	mu   sync.Mutex
	held []int // block numbers
	// locks are the held blocks' lock files, kept reachable: a file the
	// collector finalizes is closed, and its lock dropped.
	locks []*os.File
	next  int // index into the held blocks' ports, in order
}

// FreePorts hands out n distinct loopback ports, each free when drawn,
// that no other process's FreePorts hands out while this one lives, and
// this process's hands out again only after every other port of its
// blocks.
func FreePorts(n int) ([]int, error) {
	portBlocks.mu.Lock()
	defer portBlocks.mu.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == blocks*blockSize {
			return nil, fmt.Errorf("finding %d free ports on 127.0.0.1 in [%d, %d): %d tries found %d", n, lowestPort, ephemeralPort, tries, len(ports))
		}
		if portBlocks.next == len(portBlocks.held)*blockSize {
			// Every port of the held blocks handed out: take another
			// block, or go round the held ones again.
			if len(portBlocks.held) == maxBlocks {
				portBlocks.next = 0
			} else if err := takeBlock(); err != nil && len(portBlocks.held) == 0 {
				return nil, err
			} else if err != nil {
				portBlocks.next = 0
			}
		}
		i := portBlocks.next
		portBlocks.next++
		port := lowestPort + portBlocks.held[i/blockSize]*blockSize + i%blockSize
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // bound by someone who does not draw this way
		}
		defer l.Close()
		ports = append(ports, port)
	}
	return ports, nil
}

// takeBlock locks a block no process holds, starting at one chosen by the
// process ID so that processes started together rarely contend.
func takeBlock() error {
	dir := filepath.Join(os.TempDir(), "kshard-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("creating the port blocks' lock folder: %w", err)
	}
	start := os.Getpid() % blocks
	for k := range blocks {
		b := (start + k) % blocks
		if slices.Contains(portBlocks.held, b) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(b)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return fmt.Errorf("opening port block %d's lock: %w", b, err)
		}
		if !tryLock(f) {
			_ = f.Close()
			continue
		}
		portBlocks.held = append(portBlocks.held, b)
		portBlocks.locks = append(portBlocks.locks, f)
		return nil
	}
	return fmt.Errorf("every one of the %d port blocks in [%d, %d) is held by another process", blocks, lowestPort, ephemeralPort)
}
