package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// The objects of the run: objects ConfigBindings spread over namespaces
// labelled for kshard, over the config center's seeded domains and keys
// (seedConfigEtcd writes 50 domains of 20 keys into deploy/config-etcd).
const (
	objects          = 2000
	objectNamespaces = 4
	seededDomains    = 50
	seededKeys       = 20
	namespacePrefix  = "e2e-"
)

func objectNamespace(i int) string { return fmt.Sprintf("%s%d", namespacePrefix, i%objectNamespaces) }
func objectName(i int) string      { return fmt.Sprintf("cb-%d", i) }

// deleteObjects removes the namespaces of an earlier run and waits until
// they are gone, so each run starts from no objects.
func (s *suite) deleteObjects(ctx context.Context, t *testing.T) {
	t.Helper()
	for i := range objectNamespaces {
		err := s.cs.CoreV1().Namespaces().Delete(ctx, objectNamespace(i), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		for i := range objectNamespaces {
			_, err := s.cs.CoreV1().Namespaces().Get(ctx, objectNamespace(i), metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("namespaces of an earlier run not gone: %v", err)
	}
}

// createObjects creates the namespaces and objects ConfigBindings.
func (s *suite) createObjects(ctx context.Context, t *testing.T) {
	t.Helper()
	for i := range objectNamespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace(i), Labels: map[string]string{"kshard.dev/targets": "enabled"}}}
		if err := s.c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range objects {
		g.Go(func() error {
			cb := &configv1alpha1.ConfigBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: objectNamespace(i), Name: objectName(i)},
				Spec: configv1alpha1.ConfigBindingSpec{
					Domain: configcenter.SeedDomain(i % seededDomains),
					Keys:   []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(configcenter.SeedKey(i % seededKeys))},
					Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: objectName(i)},
				},
			}
			var err error
			werr := wait.PollUntilContextTimeout(gctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				switch err = s.c.Create(ctx, cb.DeepCopy()); {
				case err == nil || apierrors.IsAlreadyExists(err):
					return true, nil
				case schemaNotReady(err):
					return false, nil
				}
				return false, err
			})
			if werr != nil {
				return fmt.Errorf("creating %s/%s: %w (last: %v)", cb.Namespace, cb.Name, werr, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// notReady counts the objects not Ready for their current generation, and
// names one of them.
func (s *suite) notReady(ctx context.Context) (int, string, error) {
	n, example := 0, ""
	for i := range objectNamespaces {
		var list configv1alpha1.ConfigBindingList
		if err := s.c.List(ctx, &list, client.InNamespace(objectNamespace(i))); err != nil {
			return 0, "", err
		}
		for _, cb := range list.Items {
			c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation {
				n++
				example = cb.Namespace + "/" + cb.Name
			}
		}
	}
	return n, example, nil
}

// churn updates random objects' keys at about perSecond until stopped, so
// every step hands shards over while their objects change: the audit
// checks then cover writes, not only reconciles of unchanged objects.
type churn struct {
	cancel  context.CancelFunc
	done    sync.WaitGroup
	updates int
}

func (s *suite) startChurn(ctx context.Context, perSecond int) *churn {
	ctx, cancel := context.WithCancel(ctx)
	ch := &churn{cancel: cancel}
	ch.done.Add(1)
	go func() {
		defer ch.done.Done()
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			i := rand.IntN(objects)
			var cb configv1alpha1.ConfigBinding
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: objectNamespace(i), Name: objectName(i)}, &cb); err != nil {
				continue
			}
			cb.Spec.Keys = []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(configcenter.SeedKey(rand.IntN(seededKeys)))}
			if s.c.Update(ctx, &cb) == nil {
				ch.updates++
			}
		}
	}()
	return ch
}

// stop ends the churn and returns how many updates it made.
func (ch *churn) stop() int {
	ch.cancel()
	ch.done.Wait()
	return ch.updates
}

// schemaNotReady is the API server's refusal of a kind whose CRD it has
// just created: Established, yet for moments its field manager has no schema
// for it and a create fails with "Resource kind … not found" (seen on a fresh
// node right after the installation, for some of 32 concurrent creates).
func schemaNotReady(err error) bool {
	return meta.IsNoMatchError(err) || strings.Contains(err.Error(), "There can be a delay between when CustomResourceDefinitions are created")
}
