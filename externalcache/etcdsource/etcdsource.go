// Package etcdsource puts an etcd v3 key space behind externalcache: the
// config store many Kubernetes users already run, read as a Source and
// followed as a Feed. A key of the cache is the etcd key
// <prefix>/<domain>/<name>, its value the raw bytes, its revision the key's
// ModRevision; a domain's change feed is etcd's watch of the prefix, shared
// by every domain a replica follows, and the Epoch of its answers the etcd cluster's ID, so a cache follows a
// cluster that was replaced (a restore, a wiped member) by listing the domain
// again. It is the model for a Source of another service: see
// docs/external-data.md.
package etcdsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kshard/kshard/externalcache"
)

// DefaultPrefix is the key prefix of kshard's domains, unless Options.Prefix
// names another.
const DefaultPrefix = "/kshard/config"

// Options configure a Source.
type Options struct {
	// Client is the etcd client the Source reads through; its endpoints,
	// TLS, credentials and message size limits are the caller's (NewClient
	// builds one from files). Required.
	Client *clientv3.Client
	// Prefix is the key prefix under which each domain is a folder:
	// <Prefix>/<domain>/<name>. Default DefaultPrefix.
	Prefix string
	// PollTimeout bounds a change-feed poll that sees no change: the Source
	// then asks etcd for a progress notification and answers with the
	// revision it names, so the cache knows its domain current up to it.
	// Default 30s.
	PollTimeout time.Duration
	// WatchPerPoll makes each poll a watch of its own, of the domain's
	// folder from the revision after the poll's. By default one watch of
	// the whole prefix, shared by every domain's polls, answers them all
	// from a log of its events' names and revisions (SharedLogEvents):
	// etcd then holds one watcher per replica instead of one per followed
	// domain and creates none per change, and a change reaches the cache
	// sooner at high rates (at 1,000 changes/s over 1,000 domains on four
	// replicas: no watch requests against two per change, p99 17 ms against
	// 68 ms; docs/external-data.md). The shared watch brings every domain's
	// events, values included, to every replica, which drops those of
	// domains it does not follow: with few domains, many replicas or large
	// values a watch per poll costs less.
	WatchPerPoll bool
	// SharedLogEvents bounds the shared watch's log; a poll from before
	// its oldest event makes a watch of its own. Default 100,000 (a few
	// MiB).
	SharedLogEvents int
}

// Source reads keys from etcd (externalcache.Source) and follows a domain's
// changes with etcd's watch (externalcache.Feed).
type Source struct {
	opts   Options
	shared *shared // unless WatchPerPoll
}

var (
	_ externalcache.BatchSource = (*Source)(nil)
	_ externalcache.Feed        = (*Source)(nil)
)

// New validates the options and applies their defaults.
func New(opts Options) (*Source, error) {
	if opts.Client == nil {
		return nil, errors.New("configuring the etcd source: a Client is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	if opts.PollTimeout <= 0 {
		opts.PollTimeout = 30 * time.Second
	}
	if opts.SharedLogEvents <= 0 {
		opts.SharedLogEvents = 100_000
	}
	s := &Source{opts: opts}
	if !opts.WatchPerPoll {
		s.shared = newShared(s)
	}
	return s, nil
}

// domainPrefix is the folder of a domain's keys, with its trailing slash, so
// that domain "a" never reads domain "ab"'s keys.
func (s *Source) domainPrefix(domain string) string { return s.opts.Prefix + "/" + domain + "/" }

// Fetch reads one key: its value and ModRevision, or an error wrapping
// externalcache.ErrNotFound when it does not exist.
func (s *Source) Fetch(ctx context.Context, key externalcache.Key) (externalcache.Value, error) {
	actx, tried := withAttempts(ctx)
	resp, err := s.opts.Client.Get(actx, s.domainPrefix(key.Domain)+key.Name)
	if err != nil {
		return externalcache.Value{}, classify(fmt.Sprintf("reading %s from etcd", key), tried.explain(err))
	}
	if len(resp.Kvs) == 0 {
		return externalcache.Value{}, fmt.Errorf("%s: %w", key, externalcache.ErrNotFound)
	}
	kv := resp.Kvs[0]
	return externalcache.Value{Data: kv.Value, Revision: kv.ModRevision}, nil
}

// FetchBatch reads several keys of a domain in one transaction of Gets, at
// one revision, each answered as Fetch answers it. Its keys are at most the
// cache's MaxBatch (64 by default; etcd allows 128 operations in a
// transaction unless --max-txn-ops says otherwise). A batch etcd refuses
// as too many operations, or whose answer is larger than the client's
// message limit, is read again key by key, so that only a key too large
// for a message fails, as with Fetch.
func (s *Source) FetchBatch(ctx context.Context, domain string, names []string) ([]externalcache.Fetched, error) {
	ops := make([]clientv3.Op, len(names))
	for i, name := range names {
		ops[i] = clientv3.OpGet(s.domainPrefix(domain) + name)
	}
	actx, tried := withAttempts(ctx)
	resp, err := s.opts.Client.Txn(actx).Then(ops...).Commit()
	if status.Code(err) == codes.ResourceExhausted || errors.Is(err, rpctypes.ErrTooManyOps) {
		out := make([]externalcache.Fetched, len(names))
		for i, name := range names {
			out[i].Value, out[i].Err = s.Fetch(ctx, externalcache.Key{Domain: domain, Name: name})
		}
		return out, nil
	}
	if err != nil {
		return nil, classify(fmt.Sprintf("reading %d keys of domain %s from etcd", len(names), domain), tried.explain(err))
	}
	if len(resp.Responses) != len(names) {
		return nil, fmt.Errorf("reading %d keys of domain %s from etcd: %d answers", len(names), domain, len(resp.Responses))
	}
	out := make([]externalcache.Fetched, len(names))
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			out[i].Value = externalcache.Value{Data: kvs[0].Value, Revision: kvs[0].ModRevision}
		} else {
			out[i].Err = fmt.Errorf("%s/%s: %w", domain, names[i], externalcache.ErrNotFound)
		}
	}
	return out, nil
}

// Changes answers a long poll of a domain's changes after revision since.
// From revision 0 it lists every key of the domain (names and revisions, no
// values) at one revision. After it, it watches the domain's folder from
// since+1 and answers with the first events, or, after PollTimeout with none,
// with the revision of an etcd progress notification. A since that etcd
// compacted away is answered with revision 0, lower than asked, which tells
// the cache it lost the history and must list the domain again: no change
// made while a replica was away is lost, even one compacted since.
func (s *Source) Changes(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	if since <= 0 {
		return s.list(ctx, domain)
	}
	if s.shared != nil {
		return s.shared.changes(ctx, domain, since)
	}
	return s.watchDomain(ctx, domain, since)
}

// watchDomain answers a poll after since with a watch of the domain's
// folder of its own.
func (s *Source) watchDomain(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := s.opts.Client.Watch(wctx, s.domainPrefix(domain), clientv3.WithPrefix(), clientv3.WithRev(since+1), clientv3.WithProgressNotify())
	idle := time.NewTimer(s.opts.PollTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return externalcache.ChangeSet{}, ctx.Err()
		case <-idle.C:
			// Nothing changed: etcd says up to which revision, so that the
			// next poll starts there and not from a compacted one. (It
			// says nothing while its revision is below the watch's start:
			// ask again every PollTimeout.)
			if err := s.opts.Client.RequestProgress(wctx); err != nil {
				return externalcache.ChangeSet{}, classify("asking etcd for the watch's progress", err)
			}
			idle.Reset(s.opts.PollTimeout)
		case resp, ok := <-w:
			if !ok {
				if ctx.Err() != nil {
					return externalcache.ChangeSet{}, ctx.Err()
				}
				return externalcache.ChangeSet{}, fmt.Errorf("watching domain %s in etcd: the watch closed: %w", domain, errUnavailable)
			}
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				return externalcache.ChangeSet{Revision: 0, Epoch: epoch(resp.Header.ClusterId)}, nil
			}
			if err := resp.Err(); err != nil {
				return externalcache.ChangeSet{}, classify("watching domain "+domain+" in etcd", err)
			}
			if resp.Created {
				continue
			}
			if len(resp.Events) == 0 && !resp.IsProgressNotify() {
				continue
			}
			cs := externalcache.ChangeSet{Revision: max(since, resp.Header.Revision), Epoch: epoch(resp.Header.ClusterId)}
			for _, ev := range resp.Events {
				cs.Changes = append(cs.Changes, externalcache.Change{
					Name:     strings.TrimPrefix(string(ev.Kv.Key), s.domainPrefix(domain)),
					Revision: ev.Kv.ModRevision,
					Deleted:  ev.Type == mvccpb.DELETE,
				})
			}
			if n := len(resp.Events); n > 0 {
				// The events of one answer may end before the header's
				// revision (a watch answer is cut by size): the next poll
				// starts after the last event.
				cs.Revision = resp.Events[n-1].Kv.ModRevision
			}
			return cs, nil
		}
	}
}

// list answers a poll from revision 0: every key of the domain, at the
// revision etcd read them at.
func (s *Source) list(ctx context.Context, domain string) (externalcache.ChangeSet, error) {
	actx, tried := withAttempts(ctx)
	resp, err := s.opts.Client.Get(actx, s.domainPrefix(domain), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return externalcache.ChangeSet{}, classify("listing domain "+domain+" in etcd", tried.explain(err))
	}
	if s.shared != nil {
		// The shared watch starts after the first list: every later
		// list, and so every poll after one, is at or past it.
		s.shared.startAfter(resp.Header.Revision, epoch(resp.Header.ClusterId))
	}
	cs := externalcache.ChangeSet{Revision: resp.Header.Revision, Epoch: epoch(resp.Header.ClusterId)}
	for _, kv := range resp.Kvs {
		cs.Changes = append(cs.Changes, externalcache.Change{
			Name:     strings.TrimPrefix(string(kv.Key), s.domainPrefix(domain)),
			Revision: kv.ModRevision,
		})
	}
	return cs, nil
}

// epoch names an etcd cluster's history: its ID.
func epoch(clusterID uint64) string { return strconv.FormatUint(clusterID, 16) }

// errUnavailable marks a failure worth retrying.
var errUnavailable = errors.New("etcd unavailable")

// classify wraps an etcd error with what failed, as the cache needs it: a
// request etcd refused as the caller's mistake (invalid, unauthenticated,
// not permitted, too large) wraps externalcache.ErrRejected, which the cache
// neither retries soon nor counts against etcd's circuit breaker; anything
// else (unavailable, timed out, overloaded, a transport error) is retried and
// counted.
func classify(what string, err error) error {
	switch status.Code(rpctypes.Error(err)) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange:
		return fmt.Errorf("%s: %w: %w", what, externalcache.ErrRejected, err)
	}
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrInvalidAuthToken) ||
		errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return fmt.Errorf("%s: %w: %w", what, externalcache.ErrRejected, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
