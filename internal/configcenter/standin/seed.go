package standin

import (
	"fmt"

	"github.com/kshard/kshard/internal/configcenter"
)

func (s *store) seed(o configcenter.SeedOptions) (configcenter.SeedResult, error) {
	if err := o.Validate(); err != nil {
		return configcenter.SeedResult{}, fmt.Errorf("seeding: %w", err)
	}
	var res configcenter.SeedResult
	for i := 0; i < o.Domains; i++ {
		d := configcenter.SeedDomain(i)
		for j := 0; j < o.KeysPerDomain; j++ {
			k := configcenter.SeedKey(j)
			res.Revision = s.put(d, k, configcenter.SeedValue(d, k, o.ValueBytes)).Revision
			res.Keys++
		}
	}
	return res, nil
}
