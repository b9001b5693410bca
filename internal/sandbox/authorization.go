package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// authorization is the sandbox's SpiceDB: kshard's schema, namespace
// Namespace a member of team Team, the team a reader of every domain, and
// namespace Ungranted a reader of none.
type authorization struct {
	server *spicedbserver.Server
	grants *spicedbserver.Grants
}

// startAuthorization starts SpiceDB and writes the schema and the grants.
func (s *sandbox) startAuthorization(ctx context.Context) (*authorization, error) {
	dir := filepath.Join(s.opts.Dir, "spicedb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating SpiceDB's folder: %w", err)
	}
	srv, err := spicedbserver.Start(ctx, spicedbserver.Options{Dir: dir, Token: "kshard-sandbox"})
	if err != nil {
		return nil, err
	}
	a := &authorization{server: srv}
	if a.grants, err = spicedbserver.Dial(srv.ClientOptions()); err != nil {
		_ = srv.Close()
		return nil, err
	}
	if err := a.grants.WriteSchema(ctx); err != nil {
		_ = a.Close()
		return nil, err
	}
	rels := []string{"team:" + Team + "#member@kubernetes/namespace:" + Namespace}
	for i := range s.opts.Domains {
		rels = append(rels, teamReads(configcenter.SeedDomain(i)))
	}
	if err := a.grants.Touch(ctx, rels...); err != nil {
		_ = a.Close()
		return nil, err
	}
	s.out.printf("authorization: SpiceDB at %s (in memory): namespace %s reads every domain as a member of team %s; namespace %s reads none",
		srv.Endpoint(), Namespace, Team, Ungranted)
	return a, nil
}

// teamReads is the grant of a domain to team Team.
func teamReads(domain string) string {
	return "configdomain:" + domain + "#reader@team:" + Team + "#member"
}

// Close stops SpiceDB.
func (a *authorization) Close() error {
	if a.grants != nil {
		_ = a.grants.Close()
	}
	return a.server.Close()
}

// ungrantedBinding is a binding in namespace Ungranted of a domain it may
// not read: a team copying another's settings into its own namespace.
func ungrantedBinding() *configv1alpha1.ConfigBinding {
	return &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: Ungranted, Name: "copied"},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: configcenter.SeedDomain(0),
			Keys:   []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(configcenter.SeedKey(0))},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "copied-config"},
		},
	}
}
