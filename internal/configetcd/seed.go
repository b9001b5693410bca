package configetcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/internal/configcenter"
)

// seedBatch is how many keys one transaction writes: below etcd's default
// --max-txn-ops (128).
const seedBatch = 100

// Seed writes the synthetic config of o under prefix, as etcdsource reads
// it: <prefix>/domain-<i>/key-<j> = configcenter.SeedValue, a hundred keys
// per transaction. It returns the revision of the last write, the revision
// a reader that saw every seeded key has reached.
func Seed(ctx context.Context, c *clientv3.Client, prefix string, o configcenter.SeedOptions) (int64, error) {
	if err := o.Validate(); err != nil {
		return 0, fmt.Errorf("seeding the config center: %w", err)
	}
	var (
		ops []clientv3.Op
		rev int64
	)
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := c.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("seeding the config center: %w", err)
		}
		rev, ops = resp.Header.Revision, ops[:0]
		return nil
	}
	for i := range o.Domains {
		d := configcenter.SeedDomain(i)
		for j := range o.KeysPerDomain {
			k := configcenter.SeedKey(j)
			ops = append(ops, clientv3.OpPut(prefix+"/"+d+"/"+k, configcenter.SeedValue(d, k, o.ValueBytes)))
			if len(ops) == seedBatch {
				if err := flush(); err != nil {
					return 0, err
				}
			}
		}
	}
	return rev, flush()
}
