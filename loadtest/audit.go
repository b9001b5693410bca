package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/sharding"
)

// Audit logs are how the load tester proves the sharding invariants: every
// replica process writes a JSON line (sharding.AuditRecord) at the start and
// the end of each reconcile, and at the end of each write the shard's hold
// granted (`kshard controller --audit-log`), each process instance to its
// own file.
//
// The invariant that matters is "no replica writes a shard's objects outside
// its tenure of the shard's Lease": every write must have reached the API
// server while its writer held the Lease, by the Lease's own history. The
// merged reconcile intervals of one object must not intersect across
// replicas either, except across a pause: a replica stopped (SIGSTOP) past
// its Lease loses its shards without knowing, so a reconcile it had begun
// spans its successor's; it may not write, which the write check verifies.

// auditFile is the audit log of one replica process instance. A restarted
// replica writes a new file, so a reconcile cut off by SIGKILL is never
// paired with the end of a later process's reconcile.
type auditFile struct {
	Path    string
	Replica string
	// Ended is when the process ended (killed or exited), which closes the
	// reconciles it started and never ended; zero while it runs.
	Ended time.Time
}

// readAudit merges audit files into reconcile intervals per object and the
// writes. A start without an end lasts until its process ended, or until
// now for a process still running. Lines cut short by SIGKILL are skipped.
func readAudit(files []auditFile, now time.Time) (*audit.Log, error) {
	d := audit.NewLog()
	for _, af := range files {
		f, err := os.Open(af.Path)
		if err != nil {
			return d, fmt.Errorf("reading audit log %s: %w", af.Path, err)
		}
		end := af.Ended
		if end.IsZero() {
			end = now
		}
		err = d.Add(f, end)
		_ = f.Close()
		if err != nil {
			return d, fmt.Errorf("reading audit log %s: %w", af.Path, err)
		}
	}
	return d, nil
}

// acrossPause says whether a pause explains an overlap: one side's replica
// was paused (SIGSTOP) during its reconcile, or it began the reconcile
// within grace of being let go on (before its renewal loop saw the renew
// deadline pass and stopped its shards), and the other side's reconcile
// began after the pause did. The paused replica lost the shard without
// knowing; its successor took it over meanwhile. Two reconciles side by side
// with no pause between are never explained.
func acrossPause(o audit.Overlap, pauses map[string][]window, grace time.Duration) bool {
	spans := func(x, y audit.Interval) bool {
		for _, p := range pauses[x.Replica] {
			to := p.To
			if to.IsZero() {
				to = x.End // still paused when the run ended
			}
			if x.Start.Before(to.Add(grace)) && x.End.After(p.From) && !y.Start.Before(p.From) {
				return true
			}
		}
		return false
	}
	return spans(o.A, o.B) || spans(o.B, o.A)
}

// auditTail follows the audit logs while a run goes on and remembers, for
// every object, the last reconcile that ended and by whom: a handover is
// complete when every moved object was reconciled by its new holder.
type auditTail struct {
	offsets map[string]int64
	partial map[string][]byte
	// lastEnd is the last reconcile end per object ("namespace/name").
	lastEnd map[string]auditEnd
}

type auditEnd struct {
	Replica string
	At      time.Time
}

func newAuditTail() *auditTail {
	return &auditTail{offsets: map[string]int64{}, partial: map[string][]byte{}, lastEnd: map[string]auditEnd{}}
}

// poll reads what was appended to the files since the last poll.
func (t *auditTail) poll(paths []string) error {
	for _, p := range paths {
		if err := t.pollOne(p); err != nil {
			return err
		}
	}
	return nil
}

func (t *auditTail) pollOne(path string) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil // the process has not written yet
	}
	if err != nil {
		return fmt.Errorf("following audit log %s: %w", path, err)
	}
	defer f.Close()
	if _, err := f.Seek(t.offsets[path], io.SeekStart); err != nil {
		return fmt.Errorf("following audit log %s: %w", path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("following audit log %s: %w", path, err)
	}
	t.offsets[path] += int64(len(data))
	data = append(t.partial[path], data...)
	last := bytes.LastIndexByte(data, '\n')
	if last < 0 {
		t.partial[path] = data
		return nil
	}
	t.partial[path] = append([]byte(nil), data[last+1:]...)
	for _, line := range bytes.Split(data[:last], []byte("\n")) {
		var rec sharding.AuditRecord
		if json.Unmarshal(line, &rec) != nil || rec.Event != "end" {
			continue
		}
		obj := rec.Namespace + "/" + rec.Name
		if prev, ok := t.lastEnd[obj]; !ok || rec.Time.After(prev.At) {
			t.lastEnd[obj] = auditEnd{Replica: rec.Replica, At: rec.Time}
		}
	}
	return nil
}

// reconciledBy reports whether the object's last reconcile ended after since
// on the given replica.
func (t *auditTail) reconciledBy(object, replica string, since time.Time) bool {
	e, ok := t.lastEnd[object]
	return ok && e.Replica == replica && !e.At.Before(since)
}

// The names of the audit logs' checks.
const (
	checkWrites     = "no overlapping writes"
	checkReconciles = "no overlapping reconciles, other than across a pause"
)

// AuditSummary is what the audit logs and the shard Leases' history showed:
// the numbers behind the overlap checks.
type AuditSummary struct {
	// Records counts the audit lines read from Processes replica processes,
	// Objects the objects they reconciled.
	Records, Processes, Objects int
	// Writes counts the "write" records: the writes a shard's hold granted.
	// LateWrites counts those that returned after their hold ended (a pause
	// outlasted the hold while they were in flight).
	Writes, LateWrites int
	// LeaseChanges counts the holder changes seen on shard Leases
	// (acquisitions and releases), the tenures' source.
	LeaseChanges int
	// OverlappingWrites counts the writes outside their writer's tenure of
	// the shard's Lease; the first few are in Stray.
	OverlappingWrites int
	Stray             []string `json:",omitempty"`
	// ReconcileOverlaps counts the pairs of one object's reconciles on two
	// replicas that intersect with no pause between them (a failure);
	// OverlapsAcrossPause those a pause explains (see acrossPause). The
	// first few of the former are in Overlaps.
	ReconcileOverlaps, OverlapsAcrossPause int
	Overlaps                               []string `json:",omitempty"`
}

// maxExamples bounds the examples a check names.
const maxExamples = 3

func auditSummary(d *audit.Log, processes int, stray []audit.StrayWrite, changes int, overlaps []audit.Overlap, pauses map[string][]window, grace time.Duration) *AuditSummary {
	a := &AuditSummary{Records: d.Records, Processes: processes, Objects: len(d.ByObject), Writes: len(d.Writes), LateWrites: audit.LateWrites(d.Writes),
		LeaseChanges: changes, OverlappingWrites: len(stray)}
	for i, x := range stray {
		if i == maxExamples {
			break
		}
		a.Stray = append(a.Stray, x.String())
	}
	for _, o := range overlaps {
		if acrossPause(o, pauses, grace) {
			a.OverlapsAcrossPause++
			continue
		}
		a.ReconcileOverlaps++
		if len(a.Overlaps) < maxExamples {
			a.Overlaps = append(a.Overlaps, o.String())
		}
	}
	return a
}

// writeCheck passes when no write fell outside its writer's tenure, and
// there were writes to check.
func (a *AuditSummary) writeCheck(notAudited string) Check {
	c := Check{Name: checkWrites, Passed: a.OverlappingWrites == 0 && a.Writes > 0,
		Detail: fmt.Sprintf("%d overlapping writes (written when the writer did not hold the shard's Lease, by the Leases' %d holder changes) of %d writes in the audit log; %d of them returned after their hold had ended, and count at its end",
			a.OverlappingWrites, a.LeaseChanges, a.Writes, a.LateWrites)}
	if a.Writes == 0 {
		c.Detail += "; no write recorded, so the check proves nothing"
	}
	for _, x := range a.Stray {
		c.Detail += "; OVERLAPPING WRITE " + x
	}
	if n := a.OverlappingWrites - len(a.Stray); n > 0 {
		c.Detail += fmt.Sprintf("; %d more", n)
	}
	c.Detail += notAudited
	return c
}

// reconcileCheck passes when every overlap of reconciles is explained by a
// pause; those are reported, not failed.
func (a *AuditSummary) reconcileCheck(notAudited string) Check {
	c := Check{Name: checkReconciles, Passed: a.ReconcileOverlaps == 0,
		Detail: fmt.Sprintf("%d audit records of %d objects from %d replica processes; %d overlapping reconciles with no pause between them; %d across a pause (not a failure: a paused replica's reconcile spans its pause and its successor's reconciles, and may not write)",
			a.Records, a.Objects, a.Processes, a.ReconcileOverlaps, a.OverlapsAcrossPause)}
	for _, x := range a.Overlaps {
		c.Detail += "; OVERLAP " + x
	}
	if n := a.ReconcileOverlaps - len(a.Overlaps); n > 0 {
		c.Detail += fmt.Sprintf("; %d more", n)
	}
	c.Detail += notAudited
	return c
}
