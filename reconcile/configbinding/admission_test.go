package configbinding_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// servingCert writes a self-signed certificate for 127.0.0.1 into a
// directory as tls.crt and tls.key, and returns the directory and the PEM
// certificate (the CA bundle the API server trusts).
func servingCert(t *testing.T) (dir string, caPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kshard-webhook-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, caPEM
}

// freePort is a port of controlplane.FreeAddr.
func freePort(t *testing.T) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(controlplane.FreeAddr(t))
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// registerWebhook points the API server at a webhook for ConfigBindings of
// one namespace, with the deploy's failure policy (Ignore).
func registerWebhook(t *testing.T, c client.Client, ns string, port int, caPEM []byte) {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kshard-test-"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "configbindings.config.kshard.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To("https://127.0.0.1:" + strconv.Itoa(port) + configbinding.WebhookPath),
				CABundle: caPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{configv1alpha1.GroupVersion.Group}, APIVersions: []string{configv1alpha1.GroupVersion.Version},
					Resources: []string{"configbindings"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := c.Create(context.Background(), vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), vwc) })
}

// warnings collects the API server's warnings to one client.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}

func warningClient(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func binding(ns, name, domain string, keys ...string) *configv1alpha1.ConfigBinding {
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       configv1alpha1.ConfigBindingSpec{Domain: domain, Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name + "-config"}},
	}
	for _, k := range keys {
		cb.Spec.Keys = append(cb.Spec.Keys, configv1alpha1.ConfigKey(k))
	}
	return cb
}

// TestAdmissionPreCheck: with either source, a binding naming a key its
// domain does not have is rejected with a message naming the key once the
// replica knows the domain; a domain it does not know is allowed with a
// warning; an update is checked only for the keys it adds.
func TestAdmissionPreCheck(t *testing.T) {
	for _, source := range []string{replica.SourceCache, replica.SourceMirror} {
		t.Run(source, func(t *testing.T) {
			name := "admit-" + source
			known, unknown := "domain-0", "domain-1"
			if source == replica.SourceMirror {
				known, unknown = "admit-known", "admit-unknown"
			}
			dir, caPEM := servingCert(t)
			port := freePort(t)
			e := startEnvWith(t, name, func(o *replica.Options) {
				o.ExternalSource, o.WebhookPort, o.WebhookHost, o.WebhookCertDir = source, port, "127.0.0.1", dir
			})
			e.deleteMirrors(t, known, unknown)
			for _, d := range []string{known, unknown} {
				if _, err := e.cc.Put(d, "key-0", "v"); err != nil {
					t.Fatal(err)
				}
			}
			registerWebhook(t, e.c, e.ns, port, caPEM)
			wc, warns := warningClient(t)
			ctx := context.Background()

			// The first binding of the domain makes the replica know it.
			if err := wc.Create(ctx, binding(e.ns, "first", known, "key-0")); err != nil {
				t.Fatal(err)
			}
			e.waitReason(t, "first", configbinding.ReasonSynced)

			controlplane.Eventually(t, time.Minute, "unknown key rejected", func() error {
				err := wc.Create(ctx, binding(e.ns, "bad", known, "key-0", "no-such-key"))
				if err == nil {
					_ = wc.Delete(ctx, binding(e.ns, "bad", known))
					return fmt.Errorf("created; warnings %v", warns.take())
				}
				if !strings.Contains(err.Error(), `spec.keys[1]: Invalid value: "no-such-key"`) || !strings.Contains(err.Error(), known) {
					t.Fatalf("rejection does not name the key and domain: %v", err)
				}
				return nil
			})

			warns.take()
			if err := wc.Create(ctx, binding(e.ns, "other", unknown, "not-checked")); err != nil {
				t.Fatalf("binding of a domain the replica does not know: %v", err)
			}
			if w := warns.take(); len(w) == 0 || !strings.Contains(strings.Join(w, " "), "not-checked") {
				t.Fatalf("warnings %v: want one naming the unchecked key", w)
			}

			var first configv1alpha1.ConfigBinding
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := wc.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "first"}, &first); err != nil {
					return err
				}
				first.Spec.Keys = append(first.Spec.Keys, "missing-too")
				return wc.Update(ctx, &first)
			})
			if err == nil || !strings.Contains(err.Error(), `"missing-too"`) {
				t.Fatalf("update adding a missing key: %v", err)
			}
			// The key vanishes from the config center: edits that do not
			// add keys still go through.
			if _, err := e.cc.Delete(known, "key-0"); err != nil {
				t.Fatal(err)
			}
			controlplane.Eventually(t, time.Minute, "key-0 known deleted", func() error {
				if err := wc.Create(ctx, binding(e.ns, "probe", known, "key-0")); err == nil {
					_ = wc.Delete(ctx, binding(e.ns, "probe", known))
					return fmt.Errorf("key-0 still accepted")
				}
				return nil
			})
			// The controller writes status meanwhile: retry on conflicts.
			if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := wc.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "first"}, &first); err != nil {
					return err
				}
				first.Labels = map[string]string{"edited": "yes"}
				return wc.Update(ctx, &first)
			}); err != nil {
				t.Fatalf("an edit adding no key was rejected: %v", err)
			}
		})
	}
}

// TestAdmissionWebhookDown: a webhook that does not answer never blocks
// writes (failurePolicy Ignore).
func TestAdmissionWebhookDown(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c, "admit-down")
	_, caPEM := servingCert(t)
	registerWebhook(t, c, ns, freePort(t), caPEM) // nothing listens there
	if err := c.Create(context.Background(), binding(ns, "app", "domain-0", "no-such-key")); err != nil {
		t.Fatalf("create with the webhook down: %v", err)
	}
}
