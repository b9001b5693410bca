package externaldomain

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

type holder struct{}

func (holder) Reader(int32) (client.Reader, bool) { return nil, false }
func (holder) Holds(int32) bool                   { return true }
func (holder) WriteContext(ctx context.Context, _ int32) (context.Context, context.CancelFunc, bool) {
	return ctx, func() {}, true
}
func (holder) Identity() string { return "r-0" }

// TestDesiredStatus: the status a syncer writes, by case: synced and
// sorted, too large (no keys, a condition naming the limit), and
// unavailable (keys kept, only the condition changes).
func TestDesiredStatus(t *testing.T) {
	s := &syncer{m: &Mirror{opts: Options{MaxBytes: 200}}, shard: 3, domain: "d", since: 42,
		keys: map[string]configv1alpha1.MirroredKey{
			"b": {Name: "b", Value: "2", Revision: 40},
			"a": {Name: "a", Value: "1", Revision: 42},
		}}
	s.m.opts.Shards = holder{}
	var st configv1alpha1.ExternalDomainStatus
	s.desired(&st, nil)
	if len(st.Keys) != 2 || st.Keys[0].Name != "a" || st.KeyCount != 2 || st.Revision != 42 || *st.Shard != 3 || st.Replica != "r-0" {
		t.Fatalf("synced status %+v", st)
	}
	if !meta.IsStatusConditionTrue(st.Conditions, ConditionSynced) {
		t.Fatalf("conditions %+v", st.Conditions)
	}

	s.keys["c"] = configv1alpha1.MirroredKey{Name: "c", Value: strings.Repeat("x", 200), Revision: 43}
	s.since = 43
	s.desired(&st, nil)
	c := meta.FindStatusCondition(st.Conditions, ConditionSynced)
	if len(st.Keys) != 0 || st.KeyCount != 3 || c.Reason != ReasonTooLarge || !strings.Contains(c.Message, "limit of 200 bytes") {
		t.Fatalf("too-large status %+v", st)
	}

	delete(s.keys, "c")
	s.desired(&st, nil)
	kept := st.Keys
	s.desired(&st, errors.New("connection refused"))
	c = meta.FindStatusCondition(st.Conditions, ConditionSynced)
	if c.Reason != ReasonUnavailable || !strings.Contains(c.Message, "connection refused") || len(st.Keys) != len(kept) {
		t.Fatalf("unavailable status %+v", st)
	}
}

// refuser is a shard runtime whose hold has lapsed: it refuses every write.
type refuser struct{ holder }

func (refuser) WriteContext(ctx context.Context, _ int32) (context.Context, context.CancelFunc, bool) {
	return ctx, func() {}, false
}

// TestRefusedWriteKeepsTheLoop: a write that WriteContext refuses while the
// loop runs is retried (errHoldLapsed), not taken for the shard's end
// (errLost), which stopped the domain's loop while its shard was still held;
// once the release stopped the loop (ctx done) it is.
func TestRefusedWriteKeepsTheLoop(t *testing.T) {
	s := &syncer{m: &Mirror{opts: Options{Shards: refuser{}}}, shard: 3, domain: "d"}
	if err := s.write(context.Background(), nil); !errors.Is(err, errHoldLapsed) {
		t.Fatalf("a refused write of a running loop returned %v, want errHoldLapsed", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.write(ctx, nil); !errors.Is(err, errLost) {
		t.Fatalf("a refused write of a stopped loop returned %v, want errLost", err)
	}
}
