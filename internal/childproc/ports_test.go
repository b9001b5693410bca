package childproc

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestFreePortsKeepsDrawsApart checks the two ways a drawn port could be
// drawn again before its child binds it: a second draw in this process,
// and a draw in another process, which would have to take the lock this
// process holds on the port's block (flock locks belong to an open file,
// so a second open file here stands for another process).
func TestFreePortsKeepsDrawsApart(t *testing.T) {
	a, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range append(a, b...) {
		if seen[p] {
			t.Errorf("port %d handed out twice: %v then %v", p, a, b)
		}
		seen[p] = true
		if p < lowestPort || p >= ephemeralPort {
			t.Errorf("port %d outside [%d, %d)", p, lowestPort, ephemeralPort)
		}
		block := (p - lowestPort) / blockSize
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "kshard-ports", strconv.Itoa(block)), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("port %d's block %d has no lock file: %v", p, block, err)
		}
		if tryLock(f) {
			t.Errorf("port %d's block %d is not locked: another process could draw from it", p, block)
		}
		_ = f.Close()
	}
}
