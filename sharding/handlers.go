package sharding

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// asObject unwraps the tombstone a delete event may carry.
func asObject(obj any) (client.Object, bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(client.Object)
	return o, ok
}

// enqueue adds a request unless the shard stopped taking work. Objects from
// a shard's initial list go in at low priority, so live changes in shards
// already running are not stuck behind a newly acquired shard's backlog.
func (s *shard) enqueue(key types.NamespacedName, initial bool) {
	if !s.active() {
		return
	}
	req := Request{Shard: s.id, NamespacedName: key}
	if pq, ok := s.c.queue.q.(priorityqueue.PriorityQueue[Request]); ok && initial {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority)}, req)
		return
	}
	s.c.queue.q.Add(req)
}

func passes(preds []predicate.Predicate, f func(predicate.Predicate) bool) bool {
	for _, p := range preds {
		if !f(p) {
			return false
		}
	}
	return true
}

// primaryHandler turns the group's primary objects into requests of the
// shard each belongs to, after checking that its label matches its domain: a
// wrong label is corrected (the right shard's owner picks the object up),
// never reconciled. It keeps each shard's object count.
func (g *group) primaryHandler() toolscache.ResourceEventHandler {
	preds := g.c.opts.For.Predicates
	counted := func(o client.Object, delta int64) {
		if n, ok := g.c.keys.ShardLabel(o.GetLabels(), g.c.opts.Shards); ok {
			c := g.count(n, delta)
			if s, _, ok := g.owner(o); ok {
				s.c.metrics.objects.WithLabelValues(s.name).Set(float64(c))
			}
		}
	}
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			o, ok := asObject(obj)
			if !ok {
				return
			}
			counted(o, 1)
			s, _, ok := g.owner(o)
			if !ok || !s.rightShard(o) {
				return
			}
			if passes(preds, func(p predicate.Predicate) bool {
				return p.Create(event.CreateEvent{Object: o, IsInInitialList: initial})
			}) {
				s.enqueue(client.ObjectKeyFromObject(o), initial)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			oldO, ok1 := asObject(oldObj)
			newO, ok2 := asObject(newObj)
			if !ok1 || !ok2 {
				return
			}
			if oldO.GetLabels()[g.c.keys.Shard] != newO.GetLabels()[g.c.keys.Shard] {
				// The object moved between two shards of this group: the
				// old shard's reconcile sees NotFound, as it would with a
				// cache of its own.
				counted(oldO, -1)
				counted(newO, 1)
				if s, _, ok := g.owner(oldO); ok {
					s.enqueue(client.ObjectKeyFromObject(oldO), false)
				}
			}
			s, _, ok := g.owner(newO)
			if !ok || !s.rightShard(newO) {
				return
			}
			if passes(preds, func(p predicate.Predicate) bool {
				return p.Update(event.UpdateEvent{ObjectOld: oldO, ObjectNew: newO})
			}) {
				s.enqueue(client.ObjectKeyFromObject(newO), false)
			}
		},
		DeleteFunc: func(obj any) {
			o, ok := asObject(obj)
			if !ok {
				return
			}
			counted(o, -1)
			s, _, ok := g.owner(o)
			if !ok {
				return
			}
			// Gone from this shard's cache is not deleted: the object may
			// only have left the label selector. The reconciler sees
			// NotFound and must not clean anything up on it.
			if passes(preds, func(p predicate.Predicate) bool { return p.Delete(event.DeleteEvent{Object: o}) }) {
				s.enqueue(client.ObjectKeyFromObject(o), false)
			}
		},
	}
}

// ownedHandler enqueues the primary objects an owned object concerns, in
// the owned object's shard: its controller owner of the primary kind, or
// what the kind's Requests says.
func (g *group) ownedHandler(k Kind) toolscache.ResourceEventHandler {
	forGVK := g.c.forGVK
	owner := func(o client.Object) (types.NamespacedName, bool) {
		ref := metav1.GetControllerOf(o)
		if ref == nil || ref.Kind != forGVK.Kind {
			return types.NamespacedName{}, false
		}
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != forGVK.Group {
			return types.NamespacedName{}, false
		}
		return types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}, true
	}
	enqueue := func(oldO, newO client.Object, initial bool) {
		s, _, ok := g.owner(newO)
		if !ok {
			return
		}
		if k.Requests != nil {
			for _, key := range k.Requests(s.ctx, s.reader(g), oldO, newO) {
				s.enqueue(key, initial)
			}
			return
		}
		if key, ok := owner(newO); ok {
			s.enqueue(key, initial)
		}
	}
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			o, ok := asObject(obj)
			if !ok || !passes(k.Predicates, func(p predicate.Predicate) bool {
				return p.Create(event.CreateEvent{Object: o, IsInInitialList: initial})
			}) {
				return
			}
			enqueue(nil, o, initial)
		},
		UpdateFunc: func(oldObj, newObj any) {
			oldO, ok1 := asObject(oldObj)
			newO, ok2 := asObject(newObj)
			if !ok1 || !ok2 || !passes(k.Predicates, func(p predicate.Predicate) bool {
				return p.Update(event.UpdateEvent{ObjectOld: oldO, ObjectNew: newO})
			}) {
				return
			}
			enqueue(oldO, newO, false)
		},
		DeleteFunc: func(obj any) {
			o, ok := asObject(obj)
			if !ok || !passes(k.Predicates, func(p predicate.Predicate) bool { return p.Delete(event.DeleteEvent{Object: o}) }) {
				return
			}
			enqueue(nil, o, false)
		},
	}
}

// rightShard reports whether an object's domain maps to this shard, and
// hands it to the labeler in the background when it does not: a wrong label
// (set by hand, or by a ring of another shard count) is removed, under this
// shard's hold, and the labeler labels the object for its domain. Only the
// labeler stamps a shard label; a holder removes one only from its own
// shard's objects, so no write of a holder moves an object into a shard it
// does not hold (deploy/base's kshard-shard-writes policy).
func (s *shard) rightShard(o client.Object) bool {
	domain := s.c.opts.Domain(o)
	want := ShardOf(domain, s.c.opts.Shards)
	if want == s.id {
		return true
	}
	go func() {
		if err := s.unlabel(context.Background(), o); err != nil {
			s.log.Error(err, "Handing an object with a wrong shard label to the labeler", "object", client.ObjectKeyFromObject(o))
		} else {
			s.log.Info("Handed an object with a wrong shard label to the labeler", "object", client.ObjectKeyFromObject(o), "from", s.id, "to", want)
		}
	}()
	return false
}

// unlabel removes an object's shard and domain labels while this shard is
// held, if the object still carries this shard's label (a resourceVersion
// precondition: nothing but the labels it was seen with is removed).
func (s *shard) unlabel(ctx context.Context, o client.Object) error {
	until, ok := s.holdUntil(time.Now())
	if !ok {
		return nil
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return s.c.removeLabels(wctx, o)
}

// removeLabels removes an object's shard and domain labels with a merge
// patch conditional on the resourceVersion it was read at.
func (e *env) removeLabels(ctx context.Context, o client.Object) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": o.GetResourceVersion(),
		"labels":          map[string]any{e.keys.Shard: nil, e.keys.Domain: nil},
	}})
	if err != nil {
		return err
	}
	obj, ok := o.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("%T is not a client.Object", o)
	}
	if err := e.writer.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing the shard label of %s: %w", client.ObjectKeyFromObject(o), err)
	}
	return nil
}
