package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// auditLine renders one ResponseComplete audit event as the API server
// writes it (only the fields the checks read).
func auditLine(t *testing.T, verb, resource, ns, name, ua string, code int, rv int, shard string, holder *string) string {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	ev := map[string]any{
		"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse", "stage": "ResponseComplete",
		"verb": verb, "userAgent": ua,
		"user":                     map[string]any{"username": "system:serviceaccount:kshard-system:kshard", "extra": map[string]any{PodNameExtra: []string{"kshard-0"}}},
		"objectRef":                map[string]any{"resource": res, "subresource": sub, "namespace": ns, "name": name},
		"responseStatus":           map[string]any{"code": code},
		"requestReceivedTimestamp": time.Now().UTC().Format(metav1.RFC3339Micro),
		"stageTimestamp":           time.Now().UTC().Format(metav1.RFC3339Micro),
	}
	if code == 403 {
		ev["responseStatus"] = map[string]any{"code": code, "message": `configmaps "x" is forbidden: ValidatingAdmissionPolicy '` + FencingPolicy + `' with binding '` + FencingPolicy + `' denied request: not the holder`}
	}
	if rv > 0 {
		obj := map[string]any{"kind": "X", "metadata": map[string]any{"name": name, "resourceVersion": itoa(rv), "labels": map[string]string{"kshard.dev/shard": shard}}}
		if holder != nil {
			obj["spec"] = map[string]any{"holderIdentity": *holder}
		}
		ev["responseObject"] = obj
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestCheckExclusive plants writes in and outside tenures: late writes
// after a takeover, a release, a new incarnation; a relabel out of a shard the
// writer does not hold (into one it holds), a label removed by a writer that does not hold the
// shard, an object written into no shard; the labeler's stamps and shard
// table against the labeler Lease. The checker names exactly the planted
// violations.
func TestCheckExclusive(t *testing.T) {
	a1, b1, a2 := "kshard-0_a1", "kshard-1_b1", "kshard-0_a2"
	none := ""
	ua := func(h string) string { return UserAgent("kshard/v0.0.0", h) }
	leaseOf := func(name string) func(rv int, by, holder string) string {
		return func(rv int, by, holder string) string {
			return auditLine(t, "update", "leases", "kshard-system", name, ua(by), 200, rv, "", &holder)
		}
	}
	lease, lease5, labeler := leaseOf("kshard-shard-3"), leaseOf("kshard-shard-5"), leaseOf("kshard-labeler")
	cm := func(rv int, by string, code int) string {
		return auditLine(t, "patch", "configmaps", "app", "cm-"+itoa(rv), ua(by), code, rv, "3", nil)
	}
	write := func(name string, rv int, by, shard string) string {
		return auditLine(t, "patch", "configmaps", "app", name, ua(by), 200, rv, shard, nil)
	}
	lines := []string{
		lease(10, a1, a1),
		cm(11, a1, 200),     // in a1's tenure
		labeler(12, b1, b1), // b1 labels
		lease(20, b1, b1),   // b1 takes the shard over
		cm(21, b1, 200),     // in b1's tenure
		cm(22, a1, 200),     // a1, delayed on the wire: committed after the takeover
		cm(0, a1, 403),      // a1, refused by the fencing policy
		lease(30, b1, none),
		cm(31, b1, 200),   // after b1 released
		lease(40, a2, a2), // the same replica, a new incarnation
		cm(41, a1, 200),   // its old incarnation: not the holder
		cm(42, a2, 200),
		// a write that changed nothing returns an earlier commit's
		// revision: excused, the commit at 42 was a2's
		auditLine(t, "patch", "configmaps", "app", "cm-42", ua(b1), 200, 42, "3", nil),
		// a label stamp is the labeler's: b1 holds the labeler Lease
		auditLine(t, "patch", "configbindings", "app", "b", ua(b1), 200, 43, "3", nil),
		// a write by a replica's user without a holder in its user agent
		auditLine(t, "patch", "configbindings/status", "app", "b", "kubectl", 200, 44, "3", nil),
		// the labeler's shard table, written by the labeler
		auditLine(t, "patch", "configmaps", "kshard-system", "kshard-shard-table", ua(b1), 200, 45, "", nil),
		// another ConfigMap without a shard is no shard's write, and cannot be ordered
		auditLine(t, "patch", "configmaps", "kshard-system", "other", ua(b1), 200, 46, "", nil),
		lease5(47, b1, b1),
		write("moved", 48, a2, "3"), // in a2's shard
		write("moved", 49, b1, "5"), // taken into b1's shard from a2's: outside b1's tenure
		write("evicted", 50, a2, "3"),
		write("evicted", 51, b1, ""), // its label removed by b1, who does not hold 3
		write("handed", 52, a2, "3"),
		write("handed", 53, a2, ""), // removed by the holder of 3: in its tenure
		write("bare", 54, a2, ""),   // written into no shard
	}
	l, err := ReadAPILog(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := CheckExclusive(l, CheckOptions{Ring: "kshard", LeaseNamespace: "kshard-system", ShardTable: "kshard-shard-table",
		ReplicaUsers: []string{"system:serviceaccount:kshard-system:kshard"}})
	var stray []uint64
	for _, w := range e.Stray {
		stray = append(stray, w.Version)
	}
	if got, want := fmt.Sprint(stray), "[22 31 41 49 51]"; got != want {
		t.Errorf("stray writes at %v, want %s:\n%s", stray, want, e)
	}
	if len(e.Refused) != 1 || len(e.Unattributed) != 3 || e.LeaseWrites != 6 || e.Committed["configmaps"] != 16 {
		t.Errorf("refused %d (want 1), unattributed %d (want 3), Lease writes %d (want 6), committed ConfigMap writes %d (want 16):\n%s",
			len(e.Refused), len(e.Unattributed), e.LeaseWrites, e.Committed["configmaps"], e)
	}
	if e.OK() {
		t.Error("OK with stray writes")
	}
}

func TestReadAPILogRefusesWhatIsNotAnAuditLog(t *testing.T) {
	if _, err := ReadAPILog(strings.NewReader("I1204 04:33:09.000 some klog line\n")); err == nil {
		t.Error("a klog line read as an audit log")
	}
}

func TestHolderOf(t *testing.T) {
	for ua, want := range map[string]string{
		UserAgent("kshard/v0.0.0 (linux/amd64) kubernetes/$Format", "kshard-0_ab12"): "kshard-0_ab12",
		"kubectl/v1.37.2 (linux/amd64)":                                              "",
	} {
		if got, _ := HolderOf(ua); got != want {
			t.Errorf("HolderOf(%q) = %q, want %q", ua, got, want)
		}
	}
}

// TestReadAPILogFileReadsRotatedFiles: a Lease commit in the file the API
// server rotated out, a write under it in the current file. Read alone,
// the current file shows a write outside any tenure; read with the file
// before it, none.
func TestReadAPILogFileReadsRotatedFiles(t *testing.T) {
	h := "kshard-0_a1"
	ua := UserAgent("kshard/v0.0.0", h)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	backup := filepath.Join(dir, "audit-2026-12-04T09-03-51.572.log")
	if err := os.WriteFile(backup, []byte(auditLine(t, "update", "leases", "kshard-system", "kshard-shard-3", ua, 200, 10, "", &h)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(auditLine(t, "patch", "configmaps", "app", "cm", ua, 200, 11, "3", nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := CheckOptions{Ring: "kshard", LeaseNamespace: "kshard-system"}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	alone, err := ReadAPILog(f)
	if err != nil {
		t.Fatal(err)
	}
	if e := CheckExclusive(alone, opts); e.OK() {
		t.Fatalf("the current file alone: %s", e)
	}
	l, err := ReadAPILogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if e := CheckExclusive(l, opts); !e.OK() || e.LeaseWrites != 1 || e.Writes() != 1 {
		t.Errorf("with the rotated file: %s", e)
	}
}
