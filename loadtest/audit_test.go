package loadtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/sharding"
)

// writeAudit writes audit records as a replica would, optionally ending
// with a line cut short by SIGKILL.
func writeAudit(t *testing.T, path string, cut bool, recs ...sharding.AuditRecord) {
	t.Helper()
	var b strings.Builder
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if cut {
		b.WriteString(`{"time":"2026-01-01T00:00:0`)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func rec(replica, event, name string, at time.Time) sharding.AuditRecord {
	return sharding.AuditRecord{Time: at, Event: event, Replica: replica, Namespace: "ns", Name: name, Generation: 1}
}

func TestFindOverlaps(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	a, b, a2 := filepath.Join(dir, "a.0"), filepath.Join(dir, "b.0"), filepath.Join(dir, "a.1")
	// Replica a: object x 0–10 ms; object y starts at 20 ms and the process
	// is killed at 50 ms mid-reconcile (its last line is cut).
	writeAudit(t, a, true, rec("a", "start", "x", ms(0)), rec("a", "end", "x", ms(10)), rec("a", "start", "y", ms(20)))
	// Replica b: object x 10–15 ms (touches a's interval: no overlap);
	// object y 40–45 ms, inside the killed reconcile of a: an overlap.
	writeAudit(t, b, false, rec("b", "start", "x", ms(10)), rec("b", "end", "x", ms(15)), rec("b", "start", "y", ms(40)), rec("b", "end", "y", ms(45)))
	// Restarted a: object y 60–70 ms, after its predecessor died; its start
	// must not be paired with the dead process's open start.
	writeAudit(t, a2, false, rec("a", "start", "y", ms(60)), rec("a", "end", "y", ms(70)))

	files := []auditFile{{Path: a, Replica: "a", Ended: ms(50)}, {Path: b, Replica: "b"}, {Path: a2, Replica: "a"}}
	d, err := readAudit(files, ms(100))
	if err != nil {
		t.Fatal(err)
	}
	byObject, n := d.ByObject, d.Records
	if n != 9 {
		t.Errorf("read %d records, want 9 (the cut line skipped)", n)
	}
	if got := len(byObject["ns/y"]); got != 3 {
		t.Fatalf("object y has %d intervals, want 3: %+v", got, byObject["ns/y"])
	}
	o := audit.Overlaps(byObject)
	if len(o) != 1 {
		t.Fatalf("overlaps %v, want exactly the one of object y", o)
	}
	if o[0].Object != "ns/y" || o[0].A.Replica != "a" || !o[0].A.Open || o[0].B.Replica != "b" {
		t.Errorf("overlap %+v, want a's killed reconcile of y against b's", o[0])
	}

	// Without the kill (a's process still running at "now" = 30 ms, y's
	// reconcile open until then), b's later reconcile does not overlap.
	files[0].Ended = time.Time{}
	d, err = readAudit(files[:2], ms(30))
	if err != nil {
		t.Fatal(err)
	}
	if o := audit.Overlaps(d.ByObject); len(o) != 0 {
		t.Errorf("overlaps %v, want none", o)
	}
}

func TestAuditTail(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.0")
	t0 := time.Now()
	tail := newAuditTail()
	if err := tail.poll([]string{p}); err != nil {
		t.Fatalf("a file not written yet: %v", err)
	}
	line, _ := json.Marshal(rec("a", "end", "x", t0))
	// Half a line first, as a writer mid-write would leave it.
	if err := os.WriteFile(p, line[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tail.poll([]string{p}); err != nil {
		t.Fatal(err)
	}
	if tail.reconciledBy("ns/x", "a", t0) {
		t.Fatal("half a line must not count")
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(append(line[10:], '\n'))
	_ = f.Close()
	if err := tail.poll([]string{p}); err != nil {
		t.Fatal(err)
	}
	if !tail.reconciledBy("ns/x", "a", t0) {
		t.Error("the completed line must count")
	}
	if tail.reconciledBy("ns/x", "b", t0) || tail.reconciledBy("ns/x", "a", t0.Add(time.Second)) {
		t.Error("a reconcile by another replica, or before the event, must not count")
	}
}
