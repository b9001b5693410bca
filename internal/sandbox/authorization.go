package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	authzed "github.com/authzed/authzed-go/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// authorization is the sandbox's SpiceDB: kshard's schema, namespace
// Namespace a member of team Team, the team a reader of every domain, and
// namespace Ungranted a reader of none.
type authorization struct {
	server    *spicedbserver.Server
	client    *authzed.Client
	tokenFile string
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
	a := &authorization{server: srv, tokenFile: filepath.Join(dir, "token")}
	if err := os.WriteFile(a.tokenFile, []byte(srv.Token()), 0o600); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("writing SpiceDB's token: %w", err)
	}
	if a.client, err = spicedbsource.NewClient(spicedbsource.ClientOptions{Endpoint: srv.Endpoint(), TokenFile: a.tokenFile}); err != nil {
		_ = srv.Close()
		return nil, err
	}
	if err := a.writeSchema(ctx); err != nil {
		_ = a.Close()
		return nil, err
	}
	rels := []string{"team:" + Team + "#member@kubernetes/namespace:" + Namespace}
	for i := range s.opts.Domains {
		rels = append(rels, teamReads(configcenter.SeedDomain(i)))
	}
	if err := a.relate(ctx, v1.RelationshipUpdate_OPERATION_TOUCH, rels...); err != nil {
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

// writeSchema writes kshard's schema, retrying while SpiceDB warms up.
func (a *authorization) writeSchema(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := a.client.WriteSchema(ctx, &v1.WriteSchemaRequest{Schema: spicedbsource.Schema})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("writing SpiceDB's schema: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// relate writes relationships in SpiceDB's notation,
// "type:id#relation@type:id[#relation]".
func (a *authorization) relate(ctx context.Context, op v1.RelationshipUpdate_Operation, rels ...string) error {
	req := &v1.WriteRelationshipsRequest{}
	for _, r := range rels {
		rel, err := spicedbsource.ParseRelationship(r)
		if err != nil {
			return err
		}
		req.Updates = append(req.Updates, &v1.RelationshipUpdate{Operation: op, Relationship: rel})
	}
	if _, err := a.client.WriteRelationships(ctx, req); err != nil {
		return fmt.Errorf("writing relationships to SpiceDB: %w", err)
	}
	return nil
}

// Close stops SpiceDB.
func (a *authorization) Close() error {
	if a.client != nil {
		_ = a.client.Close()
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
