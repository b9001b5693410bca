package loadtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// apiEvent renders one ResponseComplete event of the API server's audit log
// as kube-apiserver writes it (the fields the checks read): a write of
// resource ns/name by a process with holder identity by (none: ""),
// answered with code, returning the object at resourceVersion rv (0: no
// object) labelled with shard, or for a Lease holding leaseHolder.
func apiEvent(t *testing.T, resource, ns, name, by string, code, rv int, shard, leaseHolder string) string {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	ua := "kshard/v0.0.0"
	if by != "" {
		ua = audit.UserAgent(ua, by)
	}
	now := time.Now().UTC().Format(metav1.RFC3339Micro)
	ev := map[string]any{
		"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse", "stage": "ResponseComplete",
		"verb": "patch", "userAgent": ua,
		"user":                     map[string]any{"username": serviceAccountUser(LeaseNamespace, replicaServiceAccount)},
		"objectRef":                map[string]any{"resource": res, "subresource": sub, "namespace": ns, "name": name},
		"responseStatus":           map[string]any{"code": code},
		"requestReceivedTimestamp": now, "stageTimestamp": now,
	}
	if code == 403 {
		ev["responseStatus"] = map[string]any{"code": code, "message": "ValidatingAdmissionPolicy '" + Ring + "-shard-writes' denied request: kshard fencing"}
	}
	if rv > 0 {
		obj := map[string]any{"kind": "X", "metadata": map[string]any{"name": name, "resourceVersion": strconv.Itoa(rv), "labels": map[string]string{sharding.LabelShard: shard}}}
		if res == "leases" {
			obj["spec"] = map[string]any{"holderIdentity": leaseHolder}
		}
		ev["responseObject"] = obj
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWriteCheckFailsOnAPlantedStrayWrite: the report's write check reads
// the API server's audit log and fails on a write committed after the
// writer's shard Lease moved (planted: kshard-0's ConfigMap patch committed
// after kshard-1 took shard 3), names it, and counts the policy's refusals;
// a log it cannot read, or one without replica writes, is "no data" and
// fails too.
func TestWriteCheckFailsOnAPlantedStrayWrite(t *testing.T) {
	dir := t.TempDir()
	lease := lease.ShardName(Ring, 3)
	a, b := "kshard-0_a1", "kshard-1_b1"
	base := []string{
		apiEvent(t, "leases", LeaseNamespace, lease, a, 200, 10, "", a),
		apiEvent(t, "configmaps", Namespace, "x-config", a, 200, 11, "3", ""),
		apiEvent(t, "configbindings/status", Namespace, "x", a, 200, 12, "3", ""),
		apiEvent(t, "leases", LeaseNamespace, lease, b, 200, 20, "", b),
		apiEvent(t, "configmaps", Namespace, "x-config", b, 200, 21, "3", ""),
		// a, delayed on the wire, refused by the fencing policy
		apiEvent(t, "configbindings/status", Namespace, "x", a, 403, 0, "", ""),
	}
	planted := apiEvent(t, "configmaps", Namespace, "y-config", a, 200, 22, "3", "")
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	opts := audit.CheckOptions{Ring: Ring, LeaseNamespace: LeaseNamespace, ShardTable: replica.DefaultShardTable, ReplicaUsers: []string{serviceAccountUser(LeaseNamespace, replicaServiceAccount)}}
	read := func(path string) *WriteEvidence {
		return writeEvidence(evidenceFor{log: path, check: opts, fencing: fencingBound})
	}

	clean := read(write("clean.log", base...))
	if c := clean.check(""); !c.Passed || !strings.Contains(c.Detail, "3 committed replica writes to shard resources (configbindings/status 1, configmaps 2) checked against 2 commits of the shard Leases: 0 outside the writer's tenure, 0 unattributed; 1 refused by the kshard-shard-writes admission policy (bound by the run)") {
		t.Errorf("clean log: %+v", c)
	}

	renewal := apiEvent(t, "leases", LeaseNamespace, lease, a, 409, 0, "", "")
	stray := writeEvidence(evidenceFor{log: write("stray.log", append(base, planted, renewal)...), check: opts, fencing: fencingBound,
		held: []heldWindow{{replica: "kshard-0", from: time.Now().Add(-time.Hour)}}, heldSpan: 2 * time.Hour})
	if d := stray.Delays; len(d) != 1 || d[0].Refused != 1 || d[0].Stray != 1 || d[0].Committed != 3 || d[0].LeaseConflicts != 1 {
		t.Errorf("the delay fault's evidence %+v, want kshard-0's 1 refused, 1 stray, 3 committed, 1 Lease conflict", d)
	}
	c := stray.check("")
	if c.Passed || stray.Stray != 1 || !strings.Contains(c.Detail, "1 outside the writer's tenure") || !strings.Contains(c.Detail, "OUTSIDE A TENURE: patch configmaps loadtest/y-config (shard 3) by kshard-0_a1 at resourceVersion 22") {
		t.Errorf("planted stray write: %+v, want the check failed naming it", c)
	}
	rep := &Report{Scenario: "chaos", Checks: []Check{c}}
	if md := renderMarkdown(rep); !strings.Contains(md, "| "+checkWrites+" | **FAIL** |") {
		t.Errorf("the report does not show the write check failed:\n%s", md)
	}

	for name, w := range map[string]*WriteEvidence{
		"no log":                read(""),
		"a missing log":         read(filepath.Join(dir, "missing.log")),
		"not an audit log":      read(write("klog.log", "I1204 04:33:09.000 a klog line")),
		"no replica write":      read(write("leases.log", base[0], base[3])),
		"no shard Lease write":  read(write("writes.log", base[1], base[2])),
		"nil (never evaluated)": nil,
	} {
		if c := w.check(""); c.Passed || !strings.HasPrefix(c.Detail, "no data") || strings.Contains(c.Detail, "0 outside") {
			t.Errorf("%s: %+v, want a failed check with no data", name, c)
		}
	}
}
