package replica

import (
	"runtime/debug"
	"testing"

	"github.com/go-logr/logr"
)

// TestMemoryLimitSizesRuntimeAndCache: a container memory limit becomes
// the Go soft limit (90%) and the external cache's budget (a quarter, at
// least 64 MiB); an explicit cache size and GOMEMLIMIT win.
func TestMemoryLimitSizesRuntimeAndCache(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	t.Setenv("GOMEMLIMIT", "")

	o := Options{MemoryLimit: 512 << 20}
	o.applyMemoryLimit(logr.Discard())
	if got := debug.SetMemoryLimit(-1); got != (512<<20)/10*9 {
		t.Errorf("Go soft limit %d, want 90%% of 512 MiB", got)
	}
	if o.Cache.MaxBytes != 128<<20 {
		t.Errorf("external cache %d bytes, want 128 MiB", o.Cache.MaxBytes)
	}

	small := Options{MemoryLimit: 128 << 20}
	small.applyMemoryLimit(logr.Discard())
	if small.Cache.MaxBytes != minCacheBytes {
		t.Errorf("external cache %d bytes under a 128 MiB limit, want the 64 MiB floor", small.Cache.MaxBytes)
	}

	debug.SetMemoryLimit(before)
	t.Setenv("GOMEMLIMIT", "300MiB")
	explicit := Options{MemoryLimit: 512 << 20}
	explicit.Cache.MaxBytes = 32 << 20
	explicit.applyMemoryLimit(logr.Discard())
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("Go soft limit changed to %d although GOMEMLIMIT is set", got)
	}
	if explicit.Cache.MaxBytes != 32<<20 {
		t.Errorf("an explicit cache size was overridden: %d", explicit.Cache.MaxBytes)
	}
}
