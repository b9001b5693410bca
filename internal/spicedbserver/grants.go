package spicedbserver

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	authzed "github.com/authzed/authzed-go/v1"

	"github.com/kshard/kshard/authzcache/spicedbsource"
)

// maxUpdates is how many relationship updates one WriteRelationships
// carries: SpiceDB's default limit (--write-relationships-max-updates-per-call).
const maxUpdates = 1000

// Grants writes kshard's schema and grants into a SpiceDB. kshard itself
// only reads them; what writes them here is what a user's zed would: the
// sandbox's tour, the tests, the end-to-end suite and the load tester,
// against this package's Server or a cluster's SpiceDB alike.
type Grants struct {
	client *authzed.Client
}

// Dial connects to the SpiceDB at o; Close releases it.
func Dial(o spicedbsource.ClientOptions) (*Grants, error) {
	c, err := spicedbsource.NewClient(o)
	if err != nil {
		return nil, err
	}
	return &Grants{client: c}, nil
}

// WriteSchema writes kshard's schema, retrying for up to a minute while
// SpiceDB warms up.
func (g *Grants) WriteSchema(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := g.client.WriteSchema(ctx, &v1.WriteSchemaRequest{Schema: spicedbsource.Schema})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("writing kshard's schema to SpiceDB: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Touch writes relationships in SpiceDB's notation,
// "type:id#relation@type:id[#relation]"; one already there is kept.
func (g *Grants) Touch(ctx context.Context, rels ...string) error {
	return g.write(ctx, v1.RelationshipUpdate_OPERATION_TOUCH, rels)
}

// Delete removes relationships; one not there is no error.
func (g *Grants) Delete(ctx context.Context, rels ...string) error {
	return g.write(ctx, v1.RelationshipUpdate_OPERATION_DELETE, rels)
}

// write sends rels in calls of at most maxUpdates.
func (g *Grants) write(ctx context.Context, op v1.RelationshipUpdate_Operation, rels []string) error {
	for len(rels) > 0 {
		n := min(len(rels), maxUpdates)
		req := &v1.WriteRelationshipsRequest{}
		for _, r := range rels[:n] {
			rel, err := spicedbsource.ParseRelationship(r)
			if err != nil {
				return err
			}
			req.Updates = append(req.Updates, &v1.RelationshipUpdate{Operation: op, Relationship: rel})
		}
		if _, err := g.client.WriteRelationships(ctx, req); err != nil {
			return fmt.Errorf("writing %d relationships to SpiceDB (%s, …): %w", n, rels[0], err)
		}
		rels = rels[n:]
	}
	return nil
}

// Close closes the connection.
func (g *Grants) Close() error { return g.client.Close() }
