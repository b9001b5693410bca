package configcenter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits of one seeding, so that a bad request cannot make the server allocate without bound.
const (
	maxSeedKeys       = 10_000_000
	maxSeedValueBytes = 1 << 20
	maxSeedTotalBytes = 2 << 30
)

// SeedOptions fills the server with synthetic data: domains domain-0..Domains-1, each with keys
// key-0..KeysPerDomain-1 holding ValueBytes bytes, so that load tests start from a known state.
type SeedOptions struct {
	Domains       int `json:"domains"`
	KeysPerDomain int `json:"keysPerDomain"`
	ValueBytes    int `json:"valueBytes"`
}

// SeedResult reports what a seeding wrote.
type SeedResult struct {
	Keys     int   `json:"keys"`
	Revision int64 `json:"revision"`
}

// Validate rejects negative or unreasonably large seedings.
func (o SeedOptions) Validate() error {
	if o.Domains < 0 || o.KeysPerDomain < 0 || o.ValueBytes < 0 {
		return errors.New("domains, keysPerDomain and valueBytes must not be negative")
	}
	if o.Domains > 0 && o.KeysPerDomain > maxSeedKeys/o.Domains {
		return fmt.Errorf("seeding %d domains of %d keys exceeds %d keys", o.Domains, o.KeysPerDomain, maxSeedKeys)
	}
	if o.ValueBytes > maxSeedValueBytes {
		return fmt.Errorf("valueBytes %d exceeds %d", o.ValueBytes, maxSeedValueBytes)
	}
	if int64(o.Domains)*int64(o.KeysPerDomain)*int64(o.ValueBytes) > maxSeedTotalBytes {
		return fmt.Errorf("seeding would hold more than %d bytes", maxSeedTotalBytes)
	}
	return nil
}

// SeedDomain and SeedKey name the i-th seeded domain and key.
func SeedDomain(i int) string { return "domain-" + strconv.Itoa(i) }

// SeedKey names the j-th seeded key of every seeded domain.
func SeedKey(j int) string { return "key-" + strconv.Itoa(j) }

// SeedValue is what a seeding writes to key of domain: n bytes, the same
// on every run, so that a test can predict what a seeded key holds.
func SeedValue(domain, key string, n int) string {
	prefix := domain + "/" + key + ":"
	if n <= len(prefix) {
		return prefix[:n]
	}
	return prefix + strings.Repeat("x", n-len(prefix))
}
