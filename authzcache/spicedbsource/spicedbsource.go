// Package spicedbsource puts SpiceDB behind authzcache: its
// CheckBulkPermissions answers the cache's questions (may namespace N read
// domain D?) in bulk, and its Watch API is the change feed that makes every
// kept decision stale. It is the model for another authorization system's
// Checker and Watcher (docs/security.md): OpenFGA's BatchCheck and
// ReadChanges, an OPA sidecar's decisions with a bundle revision.
package spicedbsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	authzed "github.com/authzed/authzed-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kshard/kshard/authzcache"
)

// Schema is the SpiceDB schema kshard ships: a namespace reads a domain
// when it is the domain's reader, directly or as a member of a team that
// is.
const Schema = `definition kubernetes/namespace {}

definition team {
	relation member: kubernetes/namespace
}

definition configdomain {
	relation reader: kubernetes/namespace | team#member
	permission read = reader
}
`

// The schema's names the Source asks about.
const (
	ResourceType = "configdomain"
	Permission   = "read"
	SubjectType  = "kubernetes/namespace"
)

// ParseRelationship reads a relationship in SpiceDB's notation,
// "type:id#relation@type:id[#relation]" (as zed prints them), for whoever
// writes the grants kshard reads: the sandbox, a test, an operator's tool.
func ParseRelationship(s string) (*v1.Relationship, error) {
	res, sub, ok1 := strings.Cut(s, "@")
	obj, relation, ok2 := strings.Cut(res, "#")
	ot, oid, ok3 := strings.Cut(obj, ":")
	subj, subRel, _ := strings.Cut(sub, "#")
	st, sid, ok4 := strings.Cut(subj, ":")
	if !ok1 || !ok2 || !ok3 || !ok4 || relation == "" || oid == "" || sid == "" {
		return nil, fmt.Errorf("relationship %q: want type:id#relation@type:id[#relation]", s)
	}
	return &v1.Relationship{
		Resource: &v1.ObjectReference{ObjectType: ot, ObjectId: oid}, Relation: relation,
		Subject: &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: st, ObjectId: sid}, OptionalRelation: subRel},
	}, nil
}

// ClientOptions say how to reach SpiceDB and who to be there; the token
// comes from a file (a mounted Secret), never a flag, never a log.
type ClientOptions struct {
	// Endpoint is SpiceDB's gRPC address, host:port. Required.
	Endpoint string
	// TokenFile holds the preshared key or API token (trailing newline
	// ignored). Required.
	TokenFile string
	// CAFile verifies SpiceDB's certificate; empty connects in plaintext
	// (loopback, or a sidecar).
	CAFile string
}

// NewClient builds a SpiceDB client; the caller closes it.
func NewClient(o ClientOptions) (*authzed.Client, error) {
	if o.Endpoint == "" || o.TokenFile == "" {
		return nil, errors.New("SpiceDB client: an endpoint and a token file are required")
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("SpiceDB client: reading the token file: %w", err)
	}
	tok := bearer{token: strings.TrimRight(string(b), "\r\n"), secure: o.CAFile != ""}
	transport := insecure.NewCredentials()
	if o.CAFile != "" {
		if transport, err = credentials.NewClientTLSFromFile(o.CAFile, ""); err != nil {
			return nil, fmt.Errorf("SpiceDB client: reading the CA file: %w", err)
		}
	}
	c, err := authzed.NewClient(o.Endpoint, grpc.WithTransportCredentials(transport), grpc.WithPerRPCCredentials(tok))
	if err != nil {
		return nil, fmt.Errorf("SpiceDB client for %s: %w", o.Endpoint, err)
	}
	return c, nil
}

// bearer presents the token on every call.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Source checks and follows SpiceDB for an authzcache.Cache.
type Source struct {
	client *authzed.Client
}

var (
	_ authzcache.Checker = (*Source)(nil)
	_ authzcache.Watcher = (*Source)(nil)
)

// New returns a Source reading through client.
func New(client *authzed.Client) (*Source, error) {
	if client == nil {
		return nil, errors.New("configuring the SpiceDB source: a client is required")
	}
	return &Source{client: client}, nil
}

// Check asks CheckBulkPermissions whether each namespace may read its
// domain, at least as fresh as atLeast (a ZedToken), or fully consistent
// when it is empty.
func (s *Source) Check(ctx context.Context, qs []authzcache.Question, atLeast string) ([]authzcache.Decision, error) {
	req := &v1.CheckBulkPermissionsRequest{Consistency: consistency(atLeast)}
	for _, q := range qs {
		req.Items = append(req.Items, &v1.CheckBulkPermissionsRequestItem{
			Resource:   &v1.ObjectReference{ObjectType: ResourceType, ObjectId: q.Domain},
			Permission: Permission,
			Subject:    &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: SubjectType, ObjectId: q.Namespace}},
		})
	}
	resp, err := s.client.CheckBulkPermissions(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("checking %d permissions in SpiceDB: %w", len(qs), err)
	}
	if len(resp.GetPairs()) != len(qs) {
		return nil, fmt.Errorf("checking %d permissions in SpiceDB: %d answers", len(qs), len(resp.GetPairs()))
	}
	rev := resp.GetCheckedAt().GetToken()
	out := make([]authzcache.Decision, len(qs))
	for i, p := range resp.GetPairs() {
		if e := p.GetError(); e != nil {
			return nil, fmt.Errorf("checking whether namespace %s may read domain %s in SpiceDB: %s", qs[i].Namespace, qs[i].Domain, e.GetMessage())
		}
		allowed := p.GetItem().GetPermissionship() == v1.CheckPermissionResponse_PERMISSIONSHIP_HAS_PERMISSION
		out[i] = authzcache.Decision{Allowed: allowed, Revision: rev}
		if !allowed {
			out[i].Missing = fmt.Sprintf("%s:%s#reader@%s:%s, directly or through a team it is a member of",
				ResourceType, qs[i].Domain, SubjectType, qs[i].Namespace)
		}
	}
	return out, nil
}

func consistency(atLeast string) *v1.Consistency {
	if atLeast == "" {
		return &v1.Consistency{Requirement: &v1.Consistency_FullyConsistent{FullyConsistent: true}}
	}
	return &v1.Consistency{Requirement: &v1.Consistency_AtLeastAsFresh{AtLeastAsFresh: &v1.ZedToken{Token: atLeast}}}
}

// Watch follows every relationship change from the revision from, and
// calls changed with the revision through which each answer's changes go.
// From "" it starts at the revision SpiceDB reads its schema at now, and
// reports that revision as a change at once: every decision is checked
// again at least as fresh as it, and every change after it reaches the
// Watch, whenever SpiceDB begins serving the stream (a Watch "from now"
// would miss a change made between a check and its start). Without a
// schema there is no revision to read: then it starts from now and
// reports its first answer as a change, whatever it holds.
func (s *Source) Watch(ctx context.Context, from string, changed func(revision string)) error {
	req := &v1.WatchRequest{OptionalUpdateKinds: []v1.WatchKind{
		v1.WatchKind_WATCH_KIND_INCLUDE_RELATIONSHIP_UPDATES,
		v1.WatchKind_WATCH_KIND_INCLUDE_SCHEMA_UPDATES,
		v1.WatchKind_WATCH_KIND_INCLUDE_CHECKPOINTS,
	}}
	first := false
	if from == "" {
		schema, err := s.client.ReadSchema(ctx, &v1.ReadSchemaRequest{})
		switch {
		case status.Code(err) == codes.NotFound:
			first = true
		case err != nil:
			return fmt.Errorf("watching SpiceDB: reading the revision to start at: %w", err)
		default:
			from = schema.GetReadAt().GetToken()
			changed(from)
		}
	}
	if from != "" {
		req.OptionalStartCursor = &v1.ZedToken{Token: from}
	}
	stream, err := s.client.Watch(ctx, req)
	if err != nil {
		return watchFailed(from, false, err)
	}
	answered := false
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("watching SpiceDB: the stream ended")
		}
		if err != nil {
			return watchFailed(from, answered, err)
		}
		answered = true
		if first || len(resp.GetUpdates()) > 0 || resp.GetSchemaUpdated() {
			first = false
			changed(resp.GetChangesThrough().GetToken())
		}
	}
}

// watchFailed wraps a Watch's error. A resume from a revision that SpiceDB
// refuses before any answer, for another reason than the connection (a
// token of a datastore restarted empty, or past its garbage collection
// window), is authzcache.ErrResumeRefused: retrying it would fail alike.
func watchFailed(from string, answered bool, err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
	default:
		if from != "" && !answered {
			return fmt.Errorf("watching SpiceDB from %s: %w: %w", from, authzcache.ErrResumeRefused, err)
		}
	}
	return fmt.Errorf("watching SpiceDB: %w", err)
}
