package configbinding_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestLongRetryAfterIsCapped: the config center (or a proxy in front of it)
// answers 503 with Retry-After: 1h. The binding says ExternalUnavailable
// meanwhile, and once the service is back it becomes Ready within the cap
// (--cache-max-retry-after), not an hour later.
func TestLongRetryAfterIsCapped(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "retryafter", withStandin, withCache(externalcache.Options{MaxRetryAfter: 2 * time.Second,
		Retry: externalcache.RetryOptions{FailureRetryInterval: 2 * time.Second}}))
	if err := e.standin.SetFaults(configcenter.Faults{Outage: true, RetryAfter: configcenter.Duration{Duration: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", "domain-1", "key-0")
	cb := e.waitReason(t, "app", configbinding.ReasonExternalUnavailable)
	if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "503") && !strings.Contains(c.Message, "Retry-After") {
		t.Errorf("the condition does not say why: %q", c.Message)
	}
	if err := e.standin.SetFaults(configcenter.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Within two minutes (waitReason's bound), not the hour asked for.
	e.waitReason(t, "app", configbinding.ReasonSynced)
}
