package audit

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// syncLine renders the audit event of a LIST (ResponseComplete) or of the
// start of a watch (ResponseStarted), at second at of the test's clock.
func syncLine(t *testing.T, verb, stage, resource, selector, extra, ua string, at time.Time) string {
	t.Helper()
	q := url.Values{"labelSelector": {selector}}
	uri := "/apis/config.kshard.dev/v1alpha1/" + resource + "?" + q.Encode() + extra
	ev := map[string]any{
		"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata", "stage": stage,
		"verb": verb, "userAgent": ua, "requestURI": uri,
		"user":                     map[string]any{"username": "system:serviceaccount:kshard-system:kshard"},
		"objectRef":                map[string]any{"resource": resource},
		"responseStatus":           map[string]any{"code": 200},
		"requestReceivedTimestamp": at.UTC().Format(metav1.RFC3339Micro),
		"stageTimestamp":           at.UTC().Format(metav1.RFC3339Micro),
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCheckRelists plants a relist loop (an informer that syncs three
// times after a fault) among the syncs that are allowed: a relist, a cache
// started for an acquisition, a watch that resumes without syncing.
func TestCheckRelists(t *testing.T) {
	a, b := "kshard-0_a1", "kshard-1_b1"
	ua := func(h string) string { return UserAgent("kshard/v0.0.0", h) }
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	watchList := func(sel, holder string, s int) string {
		return syncLine(t, "watch", "ResponseStarted", "configbindings", sel, "&sendInitialEvents=true&watch=true", ua(holder), at(s))
	}
	lines := []string{
		// before the window: first syncs
		watchList("kshard.dev/shard in (1,2)", a, 1),
		watchList("kshard.dev/shard in (3)", b, 1),
		// in the window (10–60 s):
		watchList("kshard.dev/shard in (1,2)", a, 20),                                                           // a relists once: allowed
		watchList("kshard.dev/shard in (3)", b, 20),                                                             // b relists …
		watchList("kshard.dev/shard in (3)", b, 25),                                                             // … and again …
		syncLine(t, "list", "ResponseComplete", "configbindings", "kshard.dev/shard in (3)", "", ua(b), at(30)), // … and again, by LIST
		// a resumed watch syncs nothing
		syncLine(t, "watch", "ResponseStarted", "configbindings", "kshard.dev/shard in (1,2)", "&resourceVersion=100&watch=true", ua(a), at(21)),
		// the watch's end is not a sync
		syncLine(t, "watch", "ResponseComplete", "configbindings", "kshard.dev/shard in (1,2)", "&sendInitialEvents=true&watch=true", ua(a), at(22)),
		// a acquires shard 5 and syncs its cache twice (a relist, then a
		// new cache after the acquisition): allowed
		auditLine(t, "update", "leases", "kshard-system", "kshard-shard-5", ua(a), 200, 50, "", &a),
		watchList("kshard.dev/shard in (5)", a, 40),
		watchList("kshard.dev/shard in (5)", a, 45),
		// not a replica
		syncLine(t, "list", "ResponseComplete", "configbindings", "", "", "kubectl/v1.37.2", at(30)),
		// after the window
		watchList("kshard.dev/shard in (3)", b, 70),
	}
	lines[8] = receivedAt(t, lines[8], at(35))
	l, err := ReadAPILog(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Syncs) != 10 {
		t.Fatalf("read %d syncs, want 10: %+v", len(l.Syncs), l.Syncs)
	}
	r := CheckRelists(l, RelistOptions{Ring: "kshard", LeaseNamespace: "kshard-system", From: at(10), To: at(60)})
	t.Log(r)
	if r.OK() || len(r.Excess) != 1 || r.Excess[0].Holder != b || r.Excess[0].Syncs != 3 {
		t.Errorf("want exactly b's informer of shard 3 named, synced 3 times: %s", r)
	}
	if r.ByHolder[a] != 3 || r.ByHolder[b] != 3 {
		t.Errorf("syncs by holder %v, want 3 each", r.ByHolder)
	}
	// a's (1,2) and b's (3) may sync once, a's (5), acquired, twice.
	if got := r.AllowedClusterWide["configbindings"]; got != 4 {
		t.Errorf("the cluster-wide informers may complete %d syncs of configbindings, want 4", got)
	}
	// kubectl's LIST in the window; the one after it is not.
	if got := r.OthersClusterWide["configbindings"]; got != 1 {
		t.Errorf("other clients started %d cluster-wide syncs of configbindings, want 1", got)
	}
}

// receivedAt moves an audit event to time at.
func receivedAt(t *testing.T, line string, at time.Time) string {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatal(err)
	}
	ev["requestReceivedTimestamp"] = at.UTC().Format(metav1.RFC3339Micro)
	ev["stageTimestamp"] = at.UTC().Format(metav1.RFC3339Micro)
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
