package configbinding

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/externalcache"
)

// decided is an authorization cache that knows one answer, or none.
type decided struct {
	d  authzcache.Decision
	st authzcache.State
}

func (k decided) Await(context.Context, authzcache.Question) (authzcache.Decision, authzcache.State) {
	return k.d, k.st
}

// TestAdmissionAuthorizes: the pre-check refuses a binding its namespace
// may not read, naming the grant, and one not decided in time unless it
// fails open; it admits an allowed one.
func TestAdmissionAuthorizes(t *testing.T) {
	cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "app"},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: "payments"}}
	for _, tc := range []struct {
		name     string
		k        decided
		failOpen bool
		want     string // in the refusal; empty: admitted
	}{
		{"allowed", decided{authzcache.Decision{Allowed: true}, authzcache.Fresh}, false, ""},
		{"denied", decided{authzcache.Decision{Missing: "configdomain:payments#reader@kubernetes/namespace:team-a"}, authzcache.Fresh}, false,
			"namespace team-a may not read domain \"payments\": the authorization system has no configdomain:payments#reader@kubernetes/namespace:team-a"},
		{"denied, stale", decided{authzcache.Decision{Missing: "grant"}, authzcache.Stale}, true, "may not read"},
		{"undecided", decided{st: authzcache.Unknown}, false, "has not decided within 1ms whether namespace team-a may read domain \"payments\""},
		{"undecided, fail open", decided{st: authzcache.Unknown}, true, ""},
	} {
		a := &Admission{Keys: noKeys{}, Authorization: tc.k, AuthorizationWait: time.Millisecond, AuthorizationFailOpen: tc.failOpen}
		_, err := a.ValidateCreate(context.Background(), cb)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.want)
		}
	}
}

// noKeys knows nothing of keys.
type noKeys struct{}

func (noKeys) Exists(context.Context, externalcache.Key) (bool, bool) { return false, false }
