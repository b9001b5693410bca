package configbinding

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// Condition type and reasons. Each reason says what a person can do.
const (
	ConditionReady = "Ready"

	// ReasonSynced: the ConfigMap holds the current values.
	ReasonSynced = "Synced"
	// ReasonKeyNotFound: a key does not exist in its domain; create it in the
	// config center or remove it from spec.keys.
	ReasonKeyNotFound = "KeyNotFound"
	// ReasonExternalUnavailable: the config center fails; the ConfigMap keeps
	// the last values, and recovers by itself.
	ReasonExternalUnavailable = "ExternalUnavailable"
	// ReasonForbidden: the authorization system does not let the binding's
	// namespace read its domain (the message names the missing grant). The
	// ConfigMap holds none of the domain's values: they were removed, and
	// an event says so. A grant given later makes the binding Ready again.
	ReasonForbidden = "Forbidden"
	// ReasonValueTooLarge: a bound key's value is larger than the replica's
	// external cache holds (kshard controller --cache-max-entry-bytes); the
	// ConfigMap keeps its last values. Store a smaller value (split it over
	// keys) or raise the limit; a change of the key heals it.
	ReasonValueTooLarge = "ValueTooLarge"
	// ReasonExternalRefused: the config center refused the replica's read
	// as not permitted or invalid (the replica's credentials or grants, the
	// key's name); the ConfigMap keeps its last values. Fix the replica's
	// access; the binding looks again every RetryAfter.
	ReasonExternalRefused = "ExternalRefused"
	// ReasonTargetConflict: a ConfigMap of the target's name exists and is
	// not this binding's (someone else's, or another binding's: one binding
	// owns a target); it is left untouched. Delete it or pick another name;
	// the binding looks again every RetryAfter.
	ReasonTargetConflict = "TargetConflict"
	// ReasonTargetForbidden: the API server refused to write the target
	// ConfigMap (RBAC, or kshard's admission policy: in deploy/base the
	// replicas write ConfigMaps only in namespaces labelled
	// kshard.dev/targets=enabled). The message is the API server's; the
	// binding tries again every RetryAfter and on its next change.
	ReasonTargetForbidden = "TargetForbidden"
	// ReasonTargetTooLarge: the bound keys' values do not fit in one
	// ConfigMap (the API server accepts at most 1 MiB of data and binaryData
	// values). A binding whose own values are too large is refused before
	// anything is written; binaryData that someone else added counts too,
	// and then the API server's refusal is quoted. The ConfigMap keeps its
	// last values: bind fewer or smaller keys, or split them over two
	// bindings.
	ReasonTargetTooLarge = "TargetTooLarge"
	// ReasonTargetImmutable: someone marked the target ConfigMap
	// immutable: true, so its data can no longer change (the API server's
	// message is quoted). It keeps its last values; delete it and the
	// binding writes it again at once.
	ReasonTargetImmutable = "TargetImmutable"
	// ReasonTargetKeyConflict: the target ConfigMap has binaryData keys that
	// the binding writes as data (someone else added them; a key may not be
	// in both). The message names them and quotes the API server. Remove
	// them from binaryData; the binding looks again every RetryAfter.
	ReasonTargetKeyConflict = "TargetKeyConflict"
	// ReasonTargetInvalid: the API server refused the ConfigMap as invalid
	// for another reason (an admission policy of the cluster, for example);
	// its message is quoted. The binding looks again every RetryAfter and on
	// its next change.
	ReasonTargetInvalid = "TargetInvalid"
	// ReasonDomainTooLarge: with --external-source=mirror, the domain does
	// not fit in its ExternalDomain mirror; see the mirror's Synced
	// condition.
	ReasonDomainTooLarge = "DomainTooLarge"
	// ReasonValuesDoNotFit: the replica's external cache evicted one of the
	// binding's values for room: the values the replica reads do not fit in
	// the cache's MaxBytes together (kshard controller sizes it from
	// --memory-limit). The ConfigMap keeps its last values; raise the
	// cache's size or split the binding. It looks again every RetryAfter.
	ReasonValuesDoNotFit = "ValuesDoNotFit"
	// ReasonChangeFeedUnhealthy: the config center's change feed of the
	// binding's domain is unhealthy on this replica (its polls fail, come
	// back at once with nothing changed, or alternate between histories;
	// the message says which), so a change may reach the ConfigMap only
	// when the cached values are refreshed on their soft TTL: the ConfigMap
	// holds the values last read, not known to be current. Fix the path to
	// the config center (a proxy that does not hold long polls open, a load
	// balancer over config centers with separate histories); it heals by
	// itself, and the binding looks again every RetryAfter meanwhile.
	ReasonChangeFeedUnhealthy = "ChangeFeedUnhealthy"
)

// FieldManager owns what kshard writes with server-side apply.
const FieldManager = "kshard"

// Shards is what Reconcile needs from the sharding runtime: the shard's
// cache, leave to write while the shard is held, and its queue (to requeue
// the bindings of a domain released under them).
type Shards interface {
	// Count is the number of shards objects are spread over.
	Count() int32
	Reader(shard int32) (client.Reader, bool)
	// WriteContext grants one write of the shard's objects: ok is false
	// when the shard is not held now, and the context ends with the hold.
	WriteContext(ctx context.Context, shard int32) (context.Context, context.CancelFunc, bool)
	// OwnedLabels label a binding's ConfigMap so that its shard's caches
	// see it.
	OwnedLabels(shard int32, domain string) map[string]string
	Enqueuer
}

// Authorizer answers from a cache of the authorization system's decisions
// (*authzcache.Cache), never with a call on the reconcile path.
type Authorizer interface {
	Decide(authzcache.Question) (authzcache.Decision, authzcache.State)
}

// Reconciler reconciles one ConfigBinding per request.
type Reconciler struct {
	// Client writes (ConfigMaps by apply, status by patch).
	Client client.Client
	// APIReader reads around the caches. It is used once per missing
	// ConfigMap, to never take over one that someone else created.
	APIReader client.Reader
	Shards    Shards
	Values    Values
	// Domains is the per-domain state of Values, released when a shard's
	// last binding of a domain is deleted; nil keeps none (the direct
	// baseline).
	Domains Domains
	// Events records changes of the Ready condition's reason, and a first
	// condition that is not Ready; nil records none.
	Events events.EventRecorder
	// Authorizer decides whether a binding's namespace may read its
	// domain; nil lets every binding read every domain.
	Authorizer Authorizer
	// RetryAfter is the safety requeue of objects waiting on external data;
	// the cache's notification normally requeues them much sooner.
	// Defaults to one minute.
	RetryAfter time.Duration

	writes unseenWrites
}

// Reconcile implements reconcile.TypedReconciler for sharded requests. An
// up-to-date binding costs no API request: the ConfigMap is applied only when
// it differs from what the binding wants, status is patched only when it
// says something new, and a key whose value is merely on its way writes
// nothing (the fetch's notification requeues the binding). So a spec update
// costs two writes, and a handover of up-to-date objects none.
func (r *Reconciler) Reconcile(ctx context.Context, req sharding.Request) (reconcile.Result, error) {
	reader, ok := r.Shards.Reader(req.Shard)
	if !ok {
		return reconcile.Result{}, nil
	}
	var cb configv1alpha1.ConfigBinding
	if err := reader.Get(ctx, req.NamespacedName, &cb); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		r.writes.forget(req.NamespacedName)
		// NotFound may only mean the object left this shard: its
		// ConfigMap follows it to its shard (a deleted binding's is
		// deleted by its owner reference), and its domain may have lost
		// its last binding here.
		if err := r.handOverTargets(ctx, reader, req.Shard, req.NamespacedName); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, r.releaseUnusedDomains(ctx, reader, req.Shard)
	}
	if !cb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	log := logf.FromContext(ctx).WithValues("shard", req.Shard, "domain", cb.Spec.Domain)

	if r.Authorizer != nil {
		d, st := r.Authorizer.Decide(authzcache.Question{Namespace: cb.Namespace, Domain: cb.Spec.Domain})
		switch {
		case st == authzcache.Unknown:
			// Nothing is read or written before the decision; its arrival
			// requeues the binding.
			return reconcile.Result{RequeueAfter: r.retryAfter()}, nil
		case !d.Allowed:
			// Stale or fresh, a denial is obeyed at once.
			return reconcile.Result{}, r.forbid(ctx, reader, &cb, req.Shard, d)
		}
	}

	res := r.resolve(ctx, req.Shard, &cb)
	if res.waiting() {
		// Nothing new to say: the status keeps its last word, and an
		// observedGeneration behind the generation says the update is in
		// progress. The value's arrival requeues the binding. A binding
		// already Ready at its generation (a new owner's cold cache) needs
		// nothing else; any other gets a safety requeue in case a
		// notification is lost.
		if readyAt(&cb) && !res.deferred {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{RequeueAfter: r.retryAfter()}, nil
	}
	if res.complete() {
		refused, err := r.applyConfigMap(ctx, reader, &cb, req.Shard, res)
		if err != nil {
			return reconcile.Result{}, err
		}
		if refused != nil {
			return reconcile.Result{RequeueAfter: r.retryAfter()}, r.patchStatus(ctx, &cb, req.Shard, 0, *refused)
		}
		log.V(1).Info("ConfigMap holds the binding's values", "configMap", cb.Spec.Target.ConfigMapName, "revision", res.revision)
	}

	cond := res.condition()
	if err := r.patchStatus(ctx, &cb, req.Shard, res.revision, cond); err != nil {
		if errors.Is(err, errStale) {
			// Our cache is behind: look again shortly rather than drop
			// what we found.
			return reconcile.Result{RequeueAfter: staleRetry}, nil
		}
		return reconcile.Result{}, err
	}
	if res.deferred {
		// A stale value served while its refresh found no room.
		return reconcile.Result{RequeueAfter: r.retryAfter()}, nil
	}
	if cond.Reason == ReasonSynced || cond.Reason == ReasonKeyNotFound || cond.Reason == ReasonDomainTooLarge {
		// A created key, or a mirror that fits again, arrives through the
		// change feed or the mirror's events, not by polling.
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: r.retryAfter()}, nil
}

// forbid takes the domain's values out of the binding's ConfigMap, if it
// has one, and says Forbidden, naming the missing grant.
func (r *Reconciler) forbid(ctx context.Context, reader client.Reader, cb *configv1alpha1.ConfigBinding, shard int32, d authzcache.Decision) error {
	var current corev1.ConfigMap
	target := types.NamespacedName{Namespace: cb.Namespace, Name: cb.Spec.Target.ConfigMapName}
	if err := reader.Get(ctx, target, &current); err == nil && controllerUID(&current) == cb.UID {
		if _, err := r.applyConfigMap(ctx, reader, cb, shard, resolution{data: map[string]string{}}); err != nil {
			return err
		}
	} else if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading ConfigMap %s: %w", target.Name, err)
	}
	cond := metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonForbidden,
		Message: fmt.Sprintf("namespace %s may not read domain %s: the authorization system has no %s; the ConfigMap holds none of the domain's values",
			cb.Namespace, cb.Spec.Domain, d.Missing)}
	err := r.patchStatus(ctx, cb, shard, 0, cond)
	if errors.Is(err, errStale) {
		return nil // the binding's next event looks again
	}
	return err
}

// applyConfigMap makes the target ConfigMap hold the binding's values, with
// a server-side apply only when the cache shows it different and our own
// last apply is not simply on its way. It returns the TargetConflict
// condition, and writes nothing, when the ConfigMap is someone else's;
// TargetTooLarge, and writes nothing, when the values cannot fit; and the
// condition naming the refusal when the API server refuses the write for a
// reason a retry cannot fix (refusedApply).
func (r *Reconciler) applyConfigMap(ctx context.Context, reader client.Reader, cb *configv1alpha1.ConfigBinding, shard int32, res resolution) (*metav1.Condition, error) {
	var current corev1.ConfigMap
	target := types.NamespacedName{Namespace: cb.Namespace, Name: cb.Spec.Target.ConfigMapName}
	err := reader.Get(ctx, target, &current)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading ConfigMap %s: %w", target.Name, err)
	}
	exists := err == nil
	if exists {
		// In this shard's cache, yet not this binding's: another binding
		// names the same target, or someone copied the shard label onto
		// their own ConfigMap. Exactly one binding owns a target.
		if ref := metav1.GetControllerOf(&current); ref == nil || ref.UID != cb.UID {
			return targetConflict(target.Name, ownerOf(ref)), nil
		}
	}
	want := configMapDigest(res.data, strconv.Itoa(int(shard)), cb.Spec.Domain, cb.UID)
	if exists && cachedDigest(&current) == want {
		return nil, nil
	}
	key := writeKey{writeConfigMap, client.ObjectKeyFromObject(cb)}
	if d, ok := r.writes.pending(key, current.ResourceVersion); ok && d == want {
		return nil, nil
	}
	if !exists {
		// Not in this shard's cache: absent, or not ours (no shard label).
		owner, err := r.foreignOwner(ctx, target, cb)
		if err != nil {
			return nil, err
		}
		if owner != "" {
			return targetConflict(target.Name, owner), nil
		}
	}
	if c := tooLarge(target.Name, res.data); c != nil {
		return c, nil
	}
	ac := renderConfigMap(cb, r.Shards.OwnedLabels(shard, cb.Spec.Domain), res.data)
	wctx, done, ok := r.Shards.WriteContext(ctx, shard)
	if !ok {
		return nil, nil
	}
	err = r.Client.Apply(wctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership)
	done()
	if err != nil {
		if fenced("configmaps", err) {
			// This shard's Lease moved, or the ConfigMap is still in
			// another shard until that shard's holder hands it over
			// (handOverTargets): either way, a retry.
			return nil, fmt.Errorf("applying ConfigMap %s: refused by the shard fence (this shard's Lease moved, or the ConfigMap is in another shard until its holder hands it over): %w", target.Name, err)
		}
		if c := refusedApply(target.Name, err); c != nil {
			return c, nil
		}
		return nil, fmt.Errorf("applying ConfigMap %s: %w", target.Name, err)
	}
	if err := r.removeForeignKeys(ctx, shard, target, ac.Data, res.data); err != nil {
		return nil, err
	}
	r.writes.wrote(key, current.ResourceVersion, want)
	return nil, nil
}

// removeForeignKeys deletes the data keys the ConfigMap has (as the apply
// answered) and the binding does not want. An apply removes only fields
// that no other field manager owns: a key that an earlier controller or a
// person (kubectl edit) wrote stays after it, and the ConfigMap would never
// match its binding. A merge patch removes them whoever owns them.
func (r *Reconciler) removeForeignKeys(ctx context.Context, shard int32, target types.NamespacedName, got, want map[string]string) error {
	remove := map[string]any{}
	for k := range got {
		if _, ok := want[k]; !ok {
			remove[k] = nil
		}
	}
	if len(remove) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"data": remove})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target.Namespace, Name: target.Name}}
	wctx, done, ok := r.Shards.WriteContext(ctx, shard)
	if !ok {
		return nil
	}
	defer done()
	if err := r.Client.Patch(wctx, cm, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("removing keys of other writers from ConfigMap %s: %w", target.Name, err)
	}
	return nil
}

// controllerUID is the UID of an object's controller owner, if any.
func controllerUID(o metav1.Object) types.UID {
	if ref := metav1.GetControllerOf(o); ref != nil {
		return ref.UID
	}
	return ""
}

// readyAt reports whether the binding's status says Ready for its current
// generation.
func readyAt(cb *configv1alpha1.ConfigBinding) bool {
	c := meta.FindStatusCondition(cb.Status.Conditions, ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == cb.Generation &&
		cb.Status.ObservedGeneration == cb.Generation
}

// foreignOwner reports who else owns an existing ConfigMap of the target's
// name ("" when it does not exist or is this binding's).
func (r *Reconciler) foreignOwner(ctx context.Context, target types.NamespacedName, cb *configv1alpha1.ConfigBinding) (string, error) {
	if r.APIReader == nil {
		return "", nil
	}
	var cm corev1.ConfigMap
	if err := r.APIReader.Get(ctx, target, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading ConfigMap %s: %w", target.Name, err)
	}
	if ref := metav1.GetControllerOf(&cm); ref == nil || ref.UID != cb.UID {
		return ownerOf(ref), nil
	}
	return "", nil
}

// ownerOf names a ConfigMap's controller owner for a person.
func ownerOf(ref *metav1.OwnerReference) string {
	if ref == nil {
		return "nobody (no controller owner reference)"
	}
	return fmt.Sprintf("%s %s", ref.Kind, ref.Name)
}

// targetConflict is the condition of a binding whose target ConfigMap is
// someone else's: it is left untouched, and the binding looks again every
// RetryAfter, so it heals once the other owner lets go.
func targetConflict(name, owner string) *metav1.Condition {
	return &metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonTargetConflict,
		Message: fmt.Sprintf("ConfigMap %s exists and belongs to %s, not to this ConfigBinding: it is left untouched; delete it or choose another configMapName", name, owner)}
}

// apiMessage is the API server's own words for a refused request, the
// first maxQuoted bytes of them: a condition's message holds at most 32 KiB,
// and what an admission webhook answers is not bounded.
func apiMessage(err error) string {
	msg := err.Error()
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		msg = status.Status().Message
	}
	if len(msg) > maxQuoted {
		msg = strings.ToValidUTF8(msg[:maxQuoted], "") + "…"
	}
	return msg
}

// maxQuoted bounds the API server's words quoted in a condition.
const maxQuoted = 4 << 10

func (r *Reconciler) retryAfter() time.Duration {
	if r.RetryAfter > 0 {
		return r.RetryAfter
	}
	return time.Minute
}

// errStale: the status patch lost a resourceVersion race.
var errStale = errors.New("status patch based on a stale object")

// staleRetry is how soon a reconcile that lost a resourceVersion race
// looks again: about when the informer has caught up.
const staleRetry = 250 * time.Millisecond

// resolution is what the external values say about one ConfigBinding.
type resolution struct {
	data        map[string]string
	revision    int64
	pending     []string
	missing     []string
	unavailable error
	staleSince  time.Time
	// feed is the unhealthy change feed of the domain, if any.
	feed error
	// deferred says a key needed a fetch the cache's full queue did not
	// take: back-pressure of this replica's own, not the config center's
	// failure, and no notification will come for it, so the binding looks
	// again later and says nothing new meanwhile.
	deferred bool
}

func (r *Reconciler) resolve(ctx context.Context, shard int32, cb *configv1alpha1.ConfigBinding) resolution {
	res := resolution{data: map[string]string{}}
	for _, k := range cb.Spec.Keys {
		l := r.Values.Get(ctx, shard, externalcache.Key{Domain: cb.Spec.Domain, Name: string(k)})
		if errors.Is(l.Err, externalcache.ErrQueueFull) {
			// A replica's start asks for every key of its objects at
			// once; a full queue is a wait, not an outage (the load
			// tester's scale scenario saw a singleton's start make
			// thousands of Ready bindings say ExternalUnavailable).
			res.deferred = true
			l.Err = nil
		}
		switch l.State {
		case externalcache.StateFresh, externalcache.StateStale:
			res.data[string(k)] = string(l.Value)
			res.revision = max(res.revision, l.Revision)
			if l.Err != nil && (res.staleSince.IsZero() || l.FetchedAt.Before(res.staleSince)) {
				res.staleSince = l.FetchedAt
			}
		case externalcache.StateNotFound:
			res.missing = append(res.missing, string(k))
		default:
			res.pending = append(res.pending, string(k))
		}
		if l.Err != nil && res.unavailable == nil {
			res.unavailable = l.Err
		}
		if l.FeedErr != nil && res.feed == nil {
			res.feed = l.FeedErr
		}
	}
	return res
}

// complete reports whether every key has a value to write.
func (res resolution) complete() bool { return len(res.pending) == 0 && len(res.missing) == 0 }

// waiting reports whether values are merely on their way: nothing failed,
// nothing is missing, and nothing is to be written until they arrive.
func (res resolution) waiting() bool {
	return len(res.pending) > 0 && len(res.missing) == 0 && res.unavailable == nil
}

func (res resolution) condition() metav1.Condition {
	c := metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse}
	switch {
	case errors.Is(res.unavailable, ErrDomainTooLarge):
		c.Reason = ReasonDomainTooLarge
		c.Message = fmt.Sprintf("%v; the ConfigMap keeps its last values", res.unavailable)
	case errors.Is(res.unavailable, externalcache.ErrEvicted):
		c.Reason = ReasonValuesDoNotFit
		c.Message = fmt.Sprintf("%v; the ConfigMap keeps its last values", res.unavailable)
	case errors.Is(res.unavailable, externalcache.ErrEntryTooLarge):
		c.Reason = ReasonValueTooLarge
		c.Message = fmt.Sprintf("%v; the ConfigMap keeps its last values", res.unavailable)
	case errors.Is(res.unavailable, externalcache.ErrRejected):
		c.Reason = ReasonExternalRefused
		c.Message = fmt.Sprintf("the config center refused the read (%v); the ConfigMap keeps its last values", res.unavailable)
	case len(res.missing) > 0:
		c.Reason = ReasonKeyNotFound
		c.Message = fmt.Sprintf("keys not found in the config center: %s; the ConfigMap keeps its last values", strings.Join(res.missing, ", "))
	case res.unavailable != nil && len(res.pending) > 0:
		c.Reason = ReasonExternalUnavailable
		c.Message = fmt.Sprintf("config center unavailable (%v); no value yet for: %s", res.unavailable, strings.Join(res.pending, ", "))
	case res.unavailable != nil:
		c.Reason = ReasonExternalUnavailable
		c.Message = fmt.Sprintf("config center unavailable (%v); the ConfigMap holds values fetched at %s", res.unavailable, res.staleSince.UTC().Format(time.RFC3339))
	case res.feed != nil:
		c.Reason = ReasonChangeFeedUnhealthy
		c.Message = fmt.Sprintf("%v; a change reaches the ConfigMap only when the values are refreshed on their soft TTL, "+
			"so it may be behind; it holds revision %d", res.feed, res.revision)
	default:
		c.Status = metav1.ConditionTrue
		c.Reason = ReasonSynced
		c.Message = fmt.Sprintf("the ConfigMap holds revision %d", res.revision)
	}
	return c
}

// patchStatus writes status when it says something new, with a merge patch
// guarded by resourceVersion: a replica that lost the shard cannot overwrite
// a newer status, and a newer spec makes the patch fail and the object
// requeue. A status this replica patched and the cache does not show yet is
// not patched again.
func (r *Reconciler) patchStatus(ctx context.Context, cb *configv1alpha1.ConfigBinding, shard int32, revision int64, cond metav1.Condition) error {
	updated := cb.DeepCopy()
	st := &updated.Status
	st.ObservedGeneration = cb.Generation
	st.Shard = ptr.To(shard)
	if revision > 0 {
		st.ResolvedRevision = revision
	}
	cond.ObservedGeneration = cb.Generation
	before := meta.FindStatusCondition(cb.Status.Conditions, ConditionReady)
	meta.SetStatusCondition(&st.Conditions, cond)
	want := statusDigest(st)
	if statusDigest(&cb.Status) == want {
		return nil
	}
	key := writeKey{writeStatus, client.ObjectKeyFromObject(cb)}
	if d, ok := r.writes.pending(key, cb.ResourceVersion); ok {
		if d == want {
			return nil
		}
		// Patched over this version already: another patch would fail.
		return errStale
	}
	wctx, done, ok := r.Shards.WriteContext(ctx, shard)
	if !ok {
		return nil
	}
	err := r.Client.Status().Patch(wctx, updated, client.MergeFromWithOptions(cb, client.MergeFromWithOptimisticLock{}))
	done()
	if err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			return errStale
		case fenced("configbindings/status", err):
			return fmt.Errorf("patching the status of %s: the shard's Lease has moved: %w", client.ObjectKeyFromObject(cb), err)
		}
		return fmt.Errorf("patching status: %w", err)
	}
	r.writes.wrote(key, cb.ResourceVersion, want)
	// An Event for a change of reason only: a binding's first Ready is
	// what a create asks for, and an Event for it would cost a write per
	// create and the recorder's memory per object (its series cache).
	// A first condition that is a failure is worth one.
	if r.Events != nil && ((before == nil && cond.Status != metav1.ConditionTrue) || (before != nil && before.Reason != cond.Reason)) {
		kind := corev1.EventTypeNormal
		if cond.Status != metav1.ConditionTrue {
			kind = corev1.EventTypeWarning
		}
		r.Events.Eventf(updated, nil, kind, cond.Reason, "Reconcile", "%s", cond.Message)
	}
	return nil
}
