package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// The node's Prometheus (deploy/node-prometheus).
const (
	monitoringNamespace = "monitoring"
	prometheusService   = "prometheus-k8s"
	// metricsServiceName is the name the replicas' metrics certificate is
	// valid for and Prometheus verifies (deploy/monitoring's ServiceMonitor).
	metricsServiceName = "kshard-metrics.kshard-system.svc"
)

// installMetricsCert makes what cert-manager makes with deploy/metrics-cert:
// Secret kshard-metrics-cert (tls.crt, tls.key and ca.crt of a CA of its
// own) for the metrics Service's name, which the e2e overlay mounts into the
// replicas (--metrics-cert-dir). It returns the CA, PEM, for Prometheus.
func (s *suite) installMetricsCert(ctx context.Context, t *testing.T) []byte {
	t.Helper()
	// client-go's generator: a serving certificate for the name, followed
	// by the CA that signed it.
	chain, key, err := certutil.GenerateSelfSignedCertKeyWithOptions(certutil.SelfSignedCertKeyOptions{
		Host: metricsServiceName, MaxAge: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := certutil.ParseCertsPEM(chain)
	if err != nil || len(certs) != 2 {
		t.Fatalf("the generated chain: %d certificates (%v), want the serving one and its CA", len(certs), err)
	}
	caPEM, err := certutil.EncodeCertificates(certs[1])
	if err != nil {
		t.Fatal(err)
	}
	s.ensureNamespace(ctx, t, systemNamespace)
	s.put(ctx, t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "kshard-metrics-cert"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": chain, "tls.key": key, "ca.crt": caPEM}})
	return caPEM
}

func (s *suite) ensureNamespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	_, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// put creates an object, or replaces the one there.
func (s *suite) put(ctx context.Context, t *testing.T, obj client.Object) {
	t.Helper()
	err := s.c.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		err = s.c.Update(ctx, obj)
	}
	if err != nil {
		t.Fatalf("writing %s/%s: %v", obj.GetNamespace(), obj.GetName(), err)
	}
}

// shippedRules is deploy/monitoring's PrometheusRule as the rule file
// Prometheus loads: its groups.
func (s *suite) shippedRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.repo, "deploy", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &rule); err != nil || len(rule.Spec.Groups) == 0 {
		t.Fatalf("deploy/monitoring/prometheusrule.yaml: %d groups (%v)", len(rule.Spec.Groups), err)
	}
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// installPrometheus runs deploy/node-prometheus with the shipped rules and
// the replicas' CA, and waits until it scrapes every replica: over TLS
// verified for the metrics Service's name, with its token, which the
// replicas accept only for an identity bound to kshard-metrics-reader.
func (s *suite) installPrometheus(ctx context.Context, t *testing.T, caPEM []byte, replicas int) {
	t.Helper()
	start := time.Now()
	s.ensureNamespace(ctx, t, monitoringNamespace)
	s.put(ctx, t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: monitoringNamespace, Name: "kshard-rules"},
		Data: map[string]string{"kshard.yaml": s.shippedRules(t)}})
	s.put(ctx, t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: monitoringNamespace, Name: "kshard-metrics-ca"},
		Data: map[string]string{"ca.crt": string(caPEM)}})
	s.run(ctx, t, "apply", "--server-side", "-k", filepath.Join(s.repo, "deploy", "node-prometheus"))
	// A new CA or rules: the pod reads them at start.
	s.run(ctx, t, "-n", monitoringNamespace, "rollout", "restart", "deployment/prometheus")
	s.run(ctx, t, "-n", monitoringNamespace, "rollout", "status", "deployment/prometheus", "--timeout=5m")
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		up, err := s.promQuery(ctx, `up{job="kshard-metrics"} == 1`)
		return err == nil && len(up) == replicas, nil
	})
	if err != nil {
		targets, _ := s.promGet(ctx, "/api/v1/targets", nil)
		t.Fatalf("Prometheus does not scrape all %d replicas: %v\n%s", replicas, err, targets)
	}
	rules, err := s.promGet(ctx, "/api/v1/rules", map[string]string{"type": "alert"})
	if err != nil || strings.Count(rules, `"type":"alerting"`) < 9 {
		t.Fatalf("Prometheus has not loaded the shipped alerts (%v): %s", err, rules)
	}
	t.Logf("Prometheus scrapes all %d replicas (TLS verified, its token) and evaluates the shipped alerts, %s after it was applied",
		replicas, time.Since(start).Round(time.Second))
}

// promGet calls Prometheus's HTTP API through the API server's service
// proxy (the node's pod network is not routed to the host).
func (s *suite) promGet(ctx context.Context, path string, params map[string]string) (string, error) {
	b, err := s.cs.CoreV1().Services(monitoringNamespace).ProxyGet("http", prometheusService, "9090", path, params).DoRaw(ctx)
	return string(b), err
}

// sample is one series of an instant or range query.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`  // an instant query's
	Values [][2]any          `json:"values"` // a range query's
}

// promQuery runs an instant query and returns its series.
func (s *suite) promQuery(ctx context.Context, q string) ([]sample, error) {
	return s.promData(ctx, "/api/v1/query", map[string]string{"query": q})
}

func (s *suite) promData(ctx context.Context, path string, params map[string]string) ([]sample, error) {
	body, err := s.promGet(ctx, path, params)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []sample `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		return nil, fmt.Errorf("prometheus %s: %w: %s", path, err, body)
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("prometheus %s %v: %s", path, params, resp.Error)
	}
	return resp.Data.Result, nil
}

// alertStates reads, from Prometheus's own ALERTS series, when an alert was
// pending or firing between from and to: the raw samples (one per
// evaluation), by their own timestamps, not a range query's steps, which
// would repeat a sample from before from.
func (s *suite) alertStates(ctx context.Context, alert string, from, to time.Time) (map[string][]time.Time, error) {
	window := to.Sub(from).Truncate(time.Second) + time.Second
	series, err := s.promData(ctx, "/api/v1/query", map[string]string{
		"query": fmt.Sprintf(`ALERTS{alertname=%q}[%ds]`, alert, int(window.Seconds())),
		"time":  strconv.FormatFloat(float64(to.UnixMilli())/1000, 'f', 3, 64),
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]time.Time{}
	for _, sr := range series {
		for _, v := range sr.Values {
			if ts, ok := v[0].(float64); ok && !time.UnixMilli(int64(ts*1000)).Before(from) {
				out[sr.Metric["alertstate"]] = append(out[sr.Metric["alertstate"]], time.UnixMilli(int64(ts*1000)))
			}
		}
	}
	return out, nil
}

// checkUnownedAlert: during a takeover the unowned-shards alert, its two
// minutes not reached, never fired, and once the shards are held again it is
// resolved; whether an evaluation saw the shards unowned (they are for about
// a second) is reported.
func (s *suite) checkUnownedAlert(ctx context.Context, t *testing.T, killed time.Time) {
	t.Helper()
	const alert = "KshardUnownedShards"
	var states map[string][]time.Time
	// Resolved: no ALERTS sample any more. Prometheus evaluates every
	// second; a few evaluations settle it.
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		now, err := s.promQuery(ctx, fmt.Sprintf(`ALERTS{alertname=%q}`, alert))
		return err == nil && len(now) == 0, nil
	})
	if err != nil {
		t.Fatalf("%s is still active after the takeover: %v", alert, err)
	}
	resolvedBy := time.Now()
	if states, err = s.alertStates(ctx, alert, killed, resolvedBy); err != nil {
		t.Fatal(err)
	}
	if len(states["firing"]) > 0 {
		t.Errorf("%s fired during a takeover of seconds: %v", alert, states["firing"])
	}
	// Which replicas reported shards unowned, and when: the evidence
	// behind each pending evaluation.
	window := int(resolvedBy.Sub(killed).Seconds()) + 1
	if series, err := s.promData(ctx, "/api/v1/query", map[string]string{
		"query": fmt.Sprintf(`kshard_unowned_shards{job="kshard-metrics"}[%ds]`, window),
		"time":  strconv.FormatFloat(float64(resolvedBy.UnixMilli())/1000, 'f', 3, 64)}); err == nil {
		for _, sr := range series {
			var up []string
			for _, v := range sr.Values {
				if ts, ok := v[0].(float64); ok && v[1] != "0" {
					up = append(up, fmt.Sprintf("%v at %s", v[1], time.UnixMilli(int64(ts*1000)).Sub(killed).Round(100*time.Millisecond)))
				}
			}
			if len(up) > 0 {
				t.Logf("%s reported unowned shards after the kill: %s", sr.Metric["pod"], strings.Join(up, ", "))
			}
		}
	}
	pending := states["pending"]
	if len(pending) == 0 {
		t.Logf("%s did not go pending: the shards were unowned for less than a scrape and an evaluation", alert)
		return
	}
	t.Logf("%s pending from %s to %s after the kill (%d evaluations), resolved before %s",
		alert, pending[0].Sub(killed).Round(100*time.Millisecond), pending[len(pending)-1].Sub(killed).Round(100*time.Millisecond),
		len(pending), resolvedBy.Sub(killed).Round(time.Second))
}

// mainPanels are the dashboard panels whose every query must return data on
// a running ring.
var mainPanels = []string{"Shards owned per replica", "Unowned shards", "Objects per replica", "Reconcile rate",
	"Work-queue wait", "Cache lookups by result", "External calls by code", "Memory"}

// dashboardQueries reads the queries of the main panels from the shipped
// dashboard, as Grafana sends them for namespace kshard-system.
func (s *suite) dashboardQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.repo, "deploy", "monitoring", "kshard-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("kshard-dashboard.json: %v", err)
	}
	variables := strings.NewReplacer("$namespace", systemNamespace, "$__rate_interval", "1m")
	out := map[string][]string{}
	for _, p := range dash.Panels {
		if slices.Contains(mainPanels, p.Title) {
			for _, target := range p.Targets {
				out[p.Title] = append(out[p.Title], variables.Replace(target.Expr))
			}
		}
	}
	for _, title := range mainPanels {
		if len(out[title]) == 0 {
			t.Fatalf("the dashboard has no panel %q with a query", title)
		}
	}
	return out
}

// checkDashboard: every query of the dashboard's main panels returns series
// from the real Prometheus, and the shards owned add up to the ring's.
func (s *suite) checkDashboard(ctx context.Context, t *testing.T) {
	t.Helper()
	queries := 0
	for panel, qs := range s.dashboardQueries(t) {
		for _, q := range qs {
			queries++
			err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
				got, err := s.promQuery(ctx, q)
				return err == nil && len(got) > 0, nil
			})
			if err != nil {
				t.Errorf("dashboard panel %q has no data: %v\n  %s", panel, err, q)
			}
		}
	}
	owned, err := s.promQuery(ctx, `sum(kshard_shards_owned{job="kshard-metrics", namespace="kshard-system"})`)
	if err != nil || len(owned) != 1 {
		t.Fatalf("sum of shards owned: %v %v", owned, err)
	}
	if owned[0].Value[1] != strconv.Itoa(int(shards)) {
		t.Errorf("Prometheus sums %v shards owned, the ring has %d", owned[0].Value[1], shards)
	}
	t.Logf("the %d queries of the dashboard's %d main panels return data; Prometheus sums %v shards owned",
		queries, len(mainPanels), owned[0].Value[1])
}

// testUnownedAlert: shards unowned for longer than a scrape make the
// unowned-shards alert go pending in the real Prometheus, fire once its two
// minutes have passed, with the shipped labels and annotations, and holding
// the shards again resolves it. A takeover after a crash leaves shards
// unowned for about a second (the sigkill step reports whether an evaluation
// caught it), so the outage is made on purpose: a member Lease of a replica
// that runs nothing (a replica hung with only its member renewal alive),
// which the ring gives shards its holders release and nobody claims, for as
// long as the suite renews it. Its name carries no ordinal of the
// StatefulSet: a member at or past the StatefulSet's count is leaving and
// given no shard (sharding/statefulset.go), so "kshard-9" would take none.
func testUnownedAlert(t *testing.T, s *suite, _ *recorder) {
	ctx := stepContext(t, 10*time.Minute)
	const alert, ghost = "KshardUnownedShards", statefulSet + "-hung"
	leases := s.cs.CoordinationV1().Leases(systemNamespace)
	name := lease.MemberName(ringName, ghost)
	now := metav1.NewMicroTime(time.Now())
	member := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: systemNamespace,
			Labels:      map[string]string{sharding.LabelRing: ringName, sharding.LabelLeaseKind: lease.KindMember},
			Annotations: map[string]string{sharding.AnnotationShards: strconv.Itoa(int(shards))}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(lease.Holder(ghost, "e2e")),
			LeaseDurationSeconds: ptr.To(int32(leaseDuration.Seconds())), AcquireTime: &now, RenewTime: &now},
	}
	if _, err := leases.Create(ctx, member, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the member Lease of %s: %v", ghost, err)
	}
	joined := time.Now()
	left := false
	leave := func() {
		if !left {
			left = true
			if err := leases.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting the member Lease of %s: %v", ghost, err)
			}
		}
	}
	t.Cleanup(leave)
	renew := func(ctx context.Context) error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	// The ghost stays until the alert fires: two minutes after it went
	// pending, and a little more.
	var firing *promAlert
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := renew(ctx); err != nil {
			return false, err
		}
		alerts, err := s.promAlerts(ctx, alert)
		if err == nil && len(alerts) == 1 && alerts[0].State == "firing" {
			firing = &alerts[0]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		unowned, _ := s.promQuery(ctx, `max(kshard_unowned_shards{job="kshard-metrics"})`)
		alerts, _ := s.promAlerts(ctx, alert)
		t.Fatalf("%s did not fire while %s held a ring place and ran nothing: %v (unowned shards: %v; alerts: %+v)", alert, ghost, err, unowned, alerts)
	}
	leave()
	leftAt := time.Now()
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := s.promQuery(ctx, fmt.Sprintf(`ALERTS{alertname=%q}`, alert))
		return err == nil && len(got) == 0, nil
	})
	if err != nil {
		t.Fatalf("%s still active after %s left the ring: %v", alert, ghost, err)
	}
	resolved := time.Now()
	states, err := s.alertStates(ctx, alert, joined, resolved)
	if err != nil {
		t.Fatal(err)
	}
	if len(states["pending"]) == 0 || len(states["firing"]) == 0 {
		t.Fatalf("%s: %d evaluations pending and %d firing in Prometheus's ALERTS series, want both", alert, len(states["pending"]), len(states["firing"]))
	}
	earliest := func(ts []time.Time) time.Time { return slices.MinFunc(ts, time.Time.Compare) }
	pendingAt, firstFiring := earliest(states["pending"]), earliest(states["firing"])
	if d := firstFiring.Sub(pendingAt); d < 2*time.Minute-time.Second {
		t.Errorf("%s fired %s after it went pending, before its 2 minutes", alert, d)
	}
	// What the receiver gets: the shipped rule's labels and annotations,
	// filled in.
	if firing.Labels["severity"] != "critical" || firing.Labels["namespace"] != systemNamespace {
		t.Errorf("%s fired with labels %v, want severity critical and namespace %s", alert, firing.Labels, systemNamespace)
	}
	if !strings.Contains(firing.Annotations["description"], "ring in "+systemNamespace+" have had no live Lease holder") ||
		firing.Annotations["summary"] != "Shards of the kshard ring have no owner." {
		t.Errorf("%s fired with annotations %v", alert, firing.Annotations)
	}
	s.settle(ctx, t, 3)
	t.Logf("%s joined the ring and ran nothing: %s pending %s later, firing %s after that (value %s: %s); %s left, and the alert was resolved %s after",
		ghost, alert, pendingAt.Sub(joined).Round(100*time.Millisecond), firstFiring.Sub(pendingAt).Round(100*time.Millisecond),
		firing.Value, firing.Annotations["description"], ghost, resolved.Sub(leftAt).Round(100*time.Millisecond))
}

// promAlert is an alert as Prometheus's /api/v1/alerts lists it: what
// Alertmanager would receive.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

// promAlerts lists the active alerts named alert.
func (s *suite) promAlerts(ctx context.Context, alert string) ([]promAlert, error) {
	raw, err := s.promGet(ctx, "/api/v1/alerts", nil)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(raw), &resp); err != nil {
		return nil, fmt.Errorf("decoding /api/v1/alerts: %w", err)
	}
	var out []promAlert
	for _, a := range resp.Data.Alerts {
		if a.Labels["alertname"] == alert {
			out = append(out, a)
		}
	}
	return out, nil
}
