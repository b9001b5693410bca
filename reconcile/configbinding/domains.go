package configbinding

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

// Domains is the state a value source keeps per domain of a shard: the
// cache's change feed and entries, or the mirror's sync loop and
// ExternalDomain. The reconciler releases a domain's state when the shard's
// last binding of the domain is deleted, so that the state follows the
// domains in use instead of growing with every domain the shard ever had.
// An external cache (through CachedDomains) and *externaldomain.Mirror
// implement it.
type Domains interface {
	// Domains lists the domains it keeps state for in shard, including
	// state an earlier holder of the shard left (the mirror's
	// ExternalDomains).
	Domains(ctx context.Context, shard int32) ([]string, error)
	// ReleaseDomain drops domain's state in shard; a later read of the
	// domain starts afresh. Releasing a domain without state does nothing.
	// It is called with a write context of the shard (Shards.WriteContext):
	// a release may delete the shard's objects.
	ReleaseDomain(ctx context.Context, shard int32, domain string) error
}

// releaseUnusedDomains releases the state of the shard's domains that no
// binding of the shard reads any more. A binding's domain is immutable, so
// a domain loses a binding only when the binding is deleted: Reconcile calls
// this on NotFound. Each domain the source keeps is looked up in the shard
// cache's domain index, an in-memory lookup.
//
// A binding of the domain created meanwhile may have read it between the
// index lookup and the release, and would then hold values that nothing
// keeps current: the index is looked up again after the release, and the
// bindings it finds are requeued, so they read the domain afresh.
func (r *Reconciler) releaseUnusedDomains(ctx context.Context, reader client.Reader, shard int32) error {
	if r.Domains == nil {
		return nil
	}
	domains, err := r.Domains.Domains(ctx, shard)
	if err != nil {
		return fmt.Errorf("listing the domains of shard %d: %w", shard, err)
	}
	for _, domain := range domains {
		used, err := domainUsed(ctx, reader, domain)
		if err != nil {
			return err
		}
		if used {
			continue
		}
		wctx, done, ok := r.Shards.WriteContext(ctx, shard)
		if !ok {
			// Not held: the shard's end releases everything.
			return nil
		}
		err = r.Domains.ReleaseDomain(wctx, shard, domain)
		done()
		if err != nil {
			return fmt.Errorf("releasing domain %s of shard %d: %w", domain, shard, err)
		}
		logf.FromContext(ctx).V(1).Info("Released a domain no binding of the shard reads", "shard", shard, "domain", domain)
		if err := r.DomainChanged(ctx, r.Shards, shard, domain); err != nil {
			return err
		}
	}
	return nil
}

// CollectUnusedDomains releases what the shard keeps for domains that no
// binding of the shard reads, once the shard's informers have synced after
// an acquisition. A domain whose last binding was deleted while another
// replica held the shard, or while no replica did, left state (an
// ExternalDomain) that no deletion this replica sees would release.
func (r *Reconciler) CollectUnusedDomains(ctx context.Context, shard int32) error {
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil
	}
	return r.releaseUnusedDomains(ctx, reader, shard)
}

// domainUsed reports whether a binding of the shard reads domain.
func domainUsed(ctx context.Context, reader client.Reader, domain string) (bool, error) {
	var list configv1alpha1.ConfigBindingList
	if err := reader.List(ctx, &list, client.MatchingFields{DomainIndex: domain}, client.Limit(1)); err != nil {
		return false, fmt.Errorf("finding ConfigBindings of domain %s: %w", domain, err)
	}
	return len(list.Items) > 0, nil
}
