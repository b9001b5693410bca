package deploy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// BenchmarkShardLabelAtCreate measures what labeling at admission costs a
// CREATE of a ConfigBinding, as the client sees it, on the same API server:
// with no mutation, with deploy/base's kshard-shard-label
// MutatingAdmissionPolicy reading a shard table of 1,000 domains, and with
// a mutating webhook doing the same from an in-memory table (what
// kubernetes-controller-sharding does), served over loopback HTTPS from
// this process. It reports the latency percentiles of the CREATE:
//
//	go test -run '^$' -bench ShardLabelAtCreate -benchtime 1000x ./deploy/
func BenchmarkShardLabelAtCreate(b *testing.B) {
	ctx := context.Background()
	c := adminClient(b)
	ns := uniqueName("kshard-label")
	createNamespace(ctx, b, c, ns, nil)
	app := uniqueName("app")
	createNamespace(ctx, b, c, app, nil)

	const domains = 1000
	table := map[string]string{}
	for i := range domains {
		d := fmt.Sprintf("domain-%d", i)
		table[d] = fmt.Sprint(sharding.ShardOf(d, sharding.DefaultShards))
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kshard-shard-table"}, Data: table}); err != nil {
		b.Fatal(err)
	}
	var policy *admissionregistrationv1.MutatingAdmissionPolicy
	for _, o := range buildInNamespace(b, "base", ns) {
		if o.GetKind() != "MutatingAdmissionPolicy" {
			continue
		}
		policy = &admissionregistrationv1.MutatingAdmissionPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, policy); err != nil {
			b.Fatal(err)
		}
	}
	if policy == nil {
		b.Fatal("deploy/base has no MutatingAdmissionPolicy")
	}
	policy.Name, policy.Namespace = policy.Name+"-"+ns, ""
	if err := c.Create(ctx, policy); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Delete(context.Background(), policy) })
	onlyApp := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: app}}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name,
			ParamRef: &admissionregistrationv1.ParamRef{Name: "kshard-shard-table", Namespace: ns,
				ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction)},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: onlyApp},
		},
	}
	url, caPEM := serveLabelWebhook(b, table)
	webhook := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "shard-label-" + ns},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "shard-label.kshard.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"config.kshard.dev"}, APIVersions: []string{"*"}, Resources: []string{"configbindings"}}}},
			NamespaceSelector:       onlyApp,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}

	// Unthrottled: client-go's default 5 requests/s would be all the
	// benchmark measured.
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = -1, 0
	w, err := client.New(&cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	created := 0
	create := func() (*configv1alpha1.ConfigBinding, error) {
		created++
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: fmt.Sprintf("cb-%d", created)},
			Spec: configv1alpha1.ConfigBindingSpec{Domain: fmt.Sprintf("domain-%d", created%domains),
				Keys: []configv1alpha1.ConfigKey{"key-0"}, Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "cm"}},
		}
		return cb, w.Create(ctx, cb)
	}
	labeled := func(want bool) func() error {
		return func() error {
			cb, err := create()
			if err != nil {
				return err
			}
			if got := cb.Labels[sharding.LabelShard] != ""; got != want {
				return fmt.Errorf("labeled at admission: %v, want %v", got, want)
			}
			return nil
		}
	}
	run := func(b *testing.B) {
		reportLatency(b, func(int) error { _, err := create(); return err })
		if err := c.DeleteAllOf(ctx, &configv1alpha1.ConfigBinding{}, client.InNamespace(app)); err != nil {
			b.Fatal(err)
		}
	}
	install := func(o client.Object) {
		o.SetResourceVersion("")
		if err := c.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	remove := func(o client.Object) {
		if err := c.Delete(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	// Alternate the three, so that a machine that gets busier or quieter
	// during the run weighs on all alike.
	for round := range 2 {
		controlplane.Eventually(b, time.Minute, "no mutation in force", labeled(false))
		b.Run(fmt.Sprintf("no-mutation/round-%d", round), run)
		install(binding)
		controlplane.Eventually(b, time.Minute, "the policy in force", labeled(true))
		b.Run(fmt.Sprintf("admission-policy/round-%d", round), run)
		remove(binding)
		install(webhook)
		controlplane.Eventually(b, time.Minute, "the webhook in force", labeled(true))
		b.Run(fmt.Sprintf("webhook/round-%d", round), run)
		remove(webhook)
	}
}

// serveLabelWebhook serves a mutating webhook that labels a ConfigBinding
// whose domain is in table, as the policy does, on a loopback port with a
// certificate of its own; it returns the webhook's URL and CA bundle.
func serveLabelWebhook(b *testing.B, table map[string]string) (string, []byte) {
	b.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shard-label-webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		b.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		var cb configv1alpha1.ConfigBinding
		if err := json.Unmarshal(review.Request.Object.Raw, &cb); err == nil {
			if shard, ok := table[cb.Spec.Domain]; ok {
				var ops []map[string]any
				if cb.Labels == nil {
					ops = append(ops, map[string]any{"op": "add", "path": "/metadata/labels", "value": map[string]string{}})
				}
				ops = append(ops,
					map[string]any{"op": "add", "path": "/metadata/labels/kshard.dev~1shard", "value": shard},
					map[string]any{"op": "add", "path": "/metadata/labels/kshard.dev~1domain", "value": cb.Spec.Domain})
				patch, _ := json.Marshal(ops)
				resp.Patch, resp.PatchType = patch, ptr.To(admissionv1.PatchTypeJSONPatch)
			}
		}
		review.Response, review.Request = resp, nil
		_ = json.NewEncoder(w).Encode(&review)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String() + "/mutate", certPEM
}
