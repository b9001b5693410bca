package standin

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/kshard/kshard/internal/configcenter"
)

var (
	errUnknownDomain = errors.New("domain not found")
	errUnknownKey    = errors.New("key not found")
)

// store holds every domain in memory with one global, monotonically increasing revision, like
// etcd: a change anywhere bumps it, so revisions order all changes and a reader can ask for
// "everything after N".
type store struct {
	// epoch names this store's history; revisions of another epoch are not comparable.
	epoch    string
	mu       sync.RWMutex
	revision int64
	domains  map[string]*domainState
	// created is closed and replaced whenever a domain is created, to wake change-feed polls
	// waiting on a domain that did not exist yet without keeping state for unknown names.
	created chan struct{}
}

type domainState struct {
	keys     map[string]*record
	live     int
	revision int64
	// changed is closed and replaced on every change in the domain: one broadcast to all of the
	// domain's pollers, and no polling.
	changed chan struct{}
}

type record struct {
	value    string
	revision int64
	deleted  bool
}

func newStore() *store {
	return &store{epoch: rand.Text()[:16], domains: map[string]*domainState{}, created: make(chan struct{})}
}

func (s *store) get(domain, key string) (configcenter.Value, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.domains[domain]
	if !ok {
		return configcenter.Value{}, fmt.Errorf("%w: %s", errUnknownDomain, domain)
	}
	r, ok := d.keys[key]
	if !ok || r.deleted {
		return configcenter.Value{}, fmt.Errorf("%w: %s/%s", errUnknownKey, domain, key)
	}
	return configcenter.Value{Value: r.value, Revision: r.revision}, nil
}

func (s *store) put(domain, key, value string) configcenter.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.domainLocked(domain)
	s.revision++
	r, ok := d.keys[key]
	if !ok {
		r = &record{}
		d.keys[key] = r
	}
	if !ok || r.deleted {
		d.live++
	}
	*r = record{value: value, revision: s.revision}
	s.changedLocked(d)
	return configcenter.Value{Value: value, Revision: s.revision}
}

// delete keeps a tombstone so that the change feed can tell pollers the key is gone.
func (s *store) delete(domain, key string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.domains[domain]
	if !ok {
		return 0, fmt.Errorf("%w: %s", errUnknownDomain, domain)
	}
	r, ok := d.keys[key]
	if !ok || r.deleted {
		return 0, fmt.Errorf("%w: %s/%s", errUnknownKey, domain, key)
	}
	s.revision++
	*r = record{revision: s.revision, deleted: true}
	d.live--
	s.changedLocked(d)
	return s.revision, nil
}

func (s *store) domainLocked(domain string) *domainState {
	d, ok := s.domains[domain]
	if !ok {
		d = &domainState{keys: map[string]*record{}, changed: make(chan struct{})}
		s.domains[domain] = d
		close(s.created)
		s.created = make(chan struct{})
	}
	return d
}

func (s *store) changedLocked(d *domainState) {
	d.revision = s.revision
	close(d.changed)
	d.changed = make(chan struct{})
}

// changes answers what changed in domain after since, at most limit changes in revision order.
// When nothing did, it also returns a channel that is closed on the next change that could be
// relevant, so the caller can wait for it.
func (s *store) changes(domain string, since int64, limit int) (configcenter.ChangeSet, <-chan struct{}) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.domains[domain]
	if !ok {
		return configcenter.ChangeSet{Revision: s.revision, Changes: []configcenter.Change{}, Epoch: s.epoch}, s.created
	}
	if since > s.revision || d.revision <= since {
		// since > revision: the caller knows a future this server does not (it restarted); it
		// learns so from a Revision lower than it asked for.
		return configcenter.ChangeSet{Revision: s.revision, Changes: []configcenter.Change{}, Epoch: s.epoch}, d.changed
	}
	changes := make([]configcenter.Change, 0, 16)
	for k, r := range d.keys {
		if r.revision > since {
			changes = append(changes, configcenter.Change{Key: k, Revision: r.revision, Deleted: r.deleted})
		}
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Revision < changes[j].Revision })
	rev := s.revision
	if len(changes) > limit {
		changes = changes[:limit]
		rev = changes[limit-1].Revision
	}
	return configcenter.ChangeSet{Revision: rev, Changes: changes, Epoch: s.epoch}, nil
}

// counts returns the number of domains, live keys and the current revision, for metrics.
func (s *store) counts() (domains, keys int, revision int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, d := range s.domains {
		keys += d.live
	}
	return len(s.domains), keys, s.revision
}
