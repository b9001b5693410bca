package externaldomain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

// keyOverhead approximates what one key costs in the stored object beyond
// its name and value (field names, revision, JSON punctuation).
const keyOverhead = 48

// write brings the mirror object to the syncer's state: created when
// missing, status updated when it differs. failure, when set, only marks the
// mirror Unavailable and keeps its keys. Every write is guarded twice: the
// shard must be held, and the resourceVersion must be the one last seen.
func (s *syncer) write(ctx context.Context, failure error) error {
	for attempt := 0; ; attempt++ {
		err := s.tryWrite(ctx, failure)
		if err == nil || !isGone(err) || attempt == 2 {
			return err
		}
		// Someone else wrote (the previous holder's last write, or our own
		// cache being behind): read the truth and try again.
		var fresh configv1alpha1.ExternalDomain
		switch err := s.m.opts.APIReader.Get(ctx, types.NamespacedName{Name: s.domain}, &fresh); {
		case apierrors.IsNotFound(err):
			s.obj = nil
		case err != nil:
			return fmt.Errorf("reading ExternalDomain %s: %w", s.domain, err)
		default:
			s.obj = &fresh
		}
	}
}

func (s *syncer) tryWrite(ctx context.Context, failure error) error {
	c := s.m.opts.Client
	if s.obj == nil {
		obj := &configv1alpha1.ExternalDomain{
			ObjectMeta: metav1.ObjectMeta{
				Name: s.domain,
				Labels: map[string]string{
					sharding.LabelShard:  strconv.Itoa(int(s.shard)),
					sharding.LabelDomain: s.domain,
					sharding.LabelRing:   s.m.opts.Ring,
				},
			},
			Spec: configv1alpha1.ExternalDomainSpec{Domain: s.domain},
		}
		wctx, done, ok := s.m.opts.Shards.WriteContext(ctx, s.shard)
		if !ok {
			return refused(ctx)
		}
		err := c.Create(wctx, obj)
		done()
		if err != nil {
			if apierrors.IsAlreadyExists(err) {
				mirrorWrites.WithLabelValues("conflict").Inc()
				return apierrors.NewConflict(configv1alpha1.GroupVersion.WithResource("externaldomains").GroupResource(), s.domain, err)
			}
			mirrorWrites.WithLabelValues("error").Inc()
			return fmt.Errorf("creating ExternalDomain %s: %w", s.domain, err)
		}
		mirrorWrites.WithLabelValues("ok").Inc()
		s.obj = obj
	}
	updated := s.obj.DeepCopy()
	s.desired(&updated.Status, failure)
	if statusEqual(&s.obj.Status, &updated.Status) {
		return nil
	}
	wctx, done, ok := s.m.opts.Shards.WriteContext(ctx, s.shard)
	if !ok {
		return refused(ctx)
	}
	err := c.Status().Update(wctx, updated)
	done()
	if err != nil {
		if isGone(err) {
			mirrorWrites.WithLabelValues("conflict").Inc()
			return err
		}
		mirrorWrites.WithLabelValues("error").Inc()
		return fmt.Errorf("updating ExternalDomain %s status: %w", s.domain, err)
	}
	mirrorWrites.WithLabelValues("ok").Inc()
	s.obj = updated
	return nil
}

// desired fills in the status the syncer's state calls for.
func (s *syncer) desired(st *configv1alpha1.ExternalDomainStatus, failure error) {
	st.Shard = ptr.To(s.shard)
	st.Replica = s.m.opts.Shards.Identity()
	cond := metav1.Condition{Type: ConditionSynced}
	if failure != nil {
		// Keep what the mirror holds; only say why it is not current.
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonUnavailable
		cond.Message = fmt.Sprintf("config center unavailable (%v); the mirror keeps revision %d", failure, st.Revision)
		if prev := meta.FindStatusCondition(st.Conditions, ConditionSynced); prev != nil && prev.Reason == ReasonUnavailable {
			cond.Message = prev.Message
		}
		meta.SetStatusCondition(&st.Conditions, cond)
		return
	}
	keys := make([]configv1alpha1.MirroredKey, 0, len(s.keys))
	var size int64
	for _, k := range s.keys {
		keys = append(keys, k)
		size += int64(len(k.Name) + len(k.Value) + keyOverhead)
	}
	slices.SortFunc(keys, func(a, b configv1alpha1.MirroredKey) int { return strings.Compare(a.Name, b.Name) })
	st.KeyCount = int32(len(keys))
	st.Bytes = size
	st.Epoch = s.epoch
	if st.Revision != s.since || st.LastSyncTime == nil {
		st.Revision = s.since
		st.LastSyncTime = ptr.To(metav1.NewTime(time.Now().Truncate(time.Second)))
	}
	if size > s.m.opts.MaxBytes {
		st.Keys = nil
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonTooLarge
		cond.Message = fmt.Sprintf("domain %s holds %d keys (%d bytes), above the mirror limit of %d bytes: its keys are not mirrored; "+
			"raise --mirror-max-bytes or use --external-source=cache", s.domain, len(keys), size, s.m.opts.MaxBytes)
	} else if s.feedErr != nil {
		st.Keys = keys
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonFeedUnhealthy
		cond.Message = fmt.Sprintf("%v; the mirror's %d keys are fetched again every %s instead, so a change may be that late",
			s.feedErr, len(keys), s.m.opts.RefreshInterval)
	} else {
		st.Keys = keys
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonSynced
		cond.Message = fmt.Sprintf("mirrors %d keys at revision %d", len(keys), s.since)
	}
	meta.SetStatusCondition(&st.Conditions, cond)
}

func statusEqual(a, b *configv1alpha1.ExternalDomainStatus) bool {
	if a.KeyCount != b.KeyCount || a.Bytes != b.Bytes || a.Revision != b.Revision || a.Epoch != b.Epoch || a.Replica != b.Replica ||
		ptr.Deref(a.Shard, -1) != ptr.Deref(b.Shard, -1) || !slices.Equal(a.Keys, b.Keys) || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message {
			return false
		}
	}
	return true
}

// errHoldLapsed is a write WriteContext refused while the loop still runs.
var errHoldLapsed = errors.New("the shard's hold lapsed before the write; writing again after a backoff")

// refused says what a write that WriteContext refused means. The shard's
// release stops its loops (DropShard cancels ctx) before the Lease goes:
// until then the shard is still held and its hold only lapsed for a moment
// (a renewal whose success was recorded late, a pause the renewal loop
// outlived), so the write is tried again rather than the domain given up,
// which left its mirror unwritten until a binding of it next reconciled.
func refused(ctx context.Context) error {
	if ctx.Err() != nil {
		return errLost
	}
	return errHoldLapsed
}
