package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// Two kinds of evidence prove the sharding invariants in a run.
//
// The writes: the API server's own audit log (internal/audit's Policy:
// every write to ConfigMaps, ConfigBindings, ExternalDomains and Leases,
// with the objects as committed) says which writes it committed, by which
// process (a replica names its holder identity in its user agent), at which
// etcd revision. audit.CheckExclusive checks each committed write to a
// shard's objects against the holder of the shard's Lease at that revision,
// replica and incarnation: the invariant "no replica writes a shard's
// objects outside its tenure of the shard's Lease" judged by what the API
// server did, not by what the replicas say they did. The control plane the
// load tester starts writes that log into the work folder; for a cluster of
// --kubeconfig, --apiserver-audit-log names it, and without it the write
// check has no data and fails.
//
// The reconciles: every replica process writes a JSON line
// (sharding.AuditRecord) at the start and the end of each reconcile
// (`kshard controller --audit-log`), each process instance to its own file.
// The merged reconcile intervals of one object must not intersect across
// replicas, except across a pause: a replica stopped (SIGSTOP) past its
// Lease loses its shards without knowing, so a reconcile it had begun spans
// its successor's; it may not write, which the write check verifies.

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

// readAudit merges audit files into reconcile intervals per object. A
// start without an end lasts until its process ended, or until now for a
// process still running. Lines cut short by SIGKILL are skipped.
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

// The names of the audit checks.
const (
	checkWrites     = "no write outside its writer's tenure (the API server's audit log)"
	checkReconciles = "no overlapping reconciles, other than across a pause"
	checkRelists    = "at most one relist per informer after an API server restart (the restarted API server's count of completed syncs, against its audit log's informers)"
)

// AuditSummary is what the replicas' audit logs showed: the numbers behind
// the reconcile check.
type AuditSummary struct {
	// Records counts the audit lines read from Processes replica processes,
	// Objects the objects they reconciled.
	Records, Processes, Objects int
	// ReconcileOverlaps counts the pairs of one object's reconciles on two
	// replicas that intersect with no pause between them (a failure);
	// OverlapsAcrossPause those a pause explains (see acrossPause). The
	// first few of the former are in Overlaps.
	ReconcileOverlaps, OverlapsAcrossPause int
	Overlaps                               []string `json:",omitempty"`
}

// maxExamples bounds the examples a check names.
const maxExamples = 3

func auditSummary(d *audit.Log, processes int, overlaps []audit.Overlap, pauses map[string][]window, grace time.Duration) *AuditSummary {
	a := &AuditSummary{Records: d.Records, Processes: processes, Objects: len(d.ByObject)}
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

// reconcileCheck passes when every overlap of reconciles is explained by a
// pause; those are reported, not failed. Without a record there is no data:
// a sharded fleet reconciles every object at least once.
func (a *AuditSummary) reconcileCheck(notAudited string) Check {
	if a.Records == 0 {
		return noDataCheck(checkReconciles, fmt.Sprintf("the audit logs of %d replica processes hold no record, so no reconcile was checked%s", a.Processes, notAudited))
	}
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

// WriteEvidence is what the API server's audit log says of the replicas'
// writes to shard resources (audit.CheckExclusive): the numbers behind the
// write check.
type WriteEvidence struct {
	// Log is the file name of the audit log read (in the run's work
	// directory, or --apiserver-audit-log's; the name alone, so that a
	// committed report carries no path of the machine that ran it); empty
	// when the run had none (a cluster of --kubeconfig without
	// --apiserver-audit-log), and then the check has no data. Error says
	// why it could not be read.
	Log   string `json:",omitempty"`
	Error string `json:",omitempty"`
	// Events counts the audit events read.
	Events int
	// Committed counts the replicas' writes to shard resources the API
	// server committed, by resource ("configmaps", "configbindings/status",
	// "externaldomains"); LeaseWrites the committed writes of the ring's
	// shard Leases they were checked against.
	Committed   map[string]int
	LeaseWrites int
	// Refused counts the replicas' writes the fencing admission policy
	// (deploy/base's kshard-shard-writes) denied; Fencing says whose policy
	// it was: "bound by the run", "left unbound (--no-fencing)", or "the
	// cluster's" for a StatefulSet's pods.
	Refused int
	Fencing string
	// Stray counts the committed writes outside their writer's tenure of
	// the shard's Lease (replica and incarnation), Unattributed those the
	// check could not place (a replica's write naming no holder, or
	// returning no object); the first few of each are in Examples.
	Stray, Unattributed int
	Examples            []string `json:",omitempty"`
	// Delays are what the API server received, late, from each victim of
	// the chaos scenario's delay fault.
	Delays []DelayEvidence `json:",omitempty"`
	// Relists are the replicas' initial syncs after each API server
	// restart of the chaos scenario (audit.CheckRelists); Syncs counts the
	// replicas' initial syncs in the whole log, without which no relist
	// could have been seen.
	Relists []RelistEvidence `json:",omitempty"`
	Syncs   int
}

// RelistEvidence is what the API server showed of the replicas' initial
// syncs after one restart of it, until its count was read: an informer
// that cannot resume its watch relists once, and more is a LIST storm.
//
// Two records are read. The audit log shows each request, so it names the
// informers and what each may sync, but of a watch-list only its start: a
// watch-list the server ends before its initial events (while its cache
// is not yet fresh, client-go retries at once) reads as a sync there. The
// restarted server's metrics count the syncs it completed (a LIST answered
// 200, a watch-list that sent its initial-events-end bookmark), which is
// what costs it a scan of the collection; the check holds those to what
// the informers may sync.
type RelistEvidence struct {
	// At is when the restart began, into the run; For how long after it
	// the count was read.
	At, For time.Duration
	// Syncs counts the replicas' sync attempts in the audit log, Informers
	// the informers that made them.
	Syncs, Informers int
	// Excess names the informers that attempted more than once (twice after
	// an acquisition).
	Excess []string `json:",omitempty"`
	// Completed is the restarted server's count of completed cluster-wide
	// syncs by resource; Allowed what the replicas' cluster-wide informers
	// of the audit log may sync, and Others the cluster-wide syncs other
	// clients started (on a cluster, its controller manager's), which the
	// server counts too. CountErr says why Completed could not be read.
	Completed map[string]float64 `json:",omitempty"`
	Allowed   map[string]int     `json:",omitempty"`
	Others    map[string]int     `json:",omitempty"`
	CountErr  string             `json:",omitempty"`
}

// relistCheck is the check of the relists after the run's API server
// restarts; ok is false when the run restarted none.
func (w *WriteEvidence) relistCheck() (Check, bool) {
	if w == nil || len(w.Relists) == 0 {
		return Check{}, false
	}
	if w.Syncs == 0 {
		return noDataCheck(checkRelists, fmt.Sprintf("the API server's audit log shows no initial sync by a replica at all (an audit policy without LISTs and watches?), so no relist after its %d restarts could have been seen", len(w.Relists))), true
	}
	c := Check{Name: checkRelists, Passed: true}
	var parts []string
	for _, r := range w.Relists {
		if r.CountErr != "" || r.Completed == nil {
			c.Passed, c.NoData = false, true
			parts = append(parts, fmt.Sprintf("restart at %s: the restarted API server's count of completed syncs could not be read (%s)", round(r.At), orUnknown(r.CountErr)))
			continue
		}
		var counts []string
		for _, res := range relistResources {
			done, allowed, others := r.Completed[res], r.Allowed[res], r.Others[res]
			text := fmt.Sprintf("%s %.0f of %d allowed", res, done, allowed)
			if others > 0 {
				text = fmt.Sprintf("%s %.0f of %d allowed (%d to the replicas, %d started by other clients)", res, done, allowed+others, allowed, others)
			}
			counts = append(counts, text)
			if done > float64(allowed+others) {
				c.Passed = false
			}
		}
		parts = append(parts, fmt.Sprintf("restart at %s, counted %s after it: the server completed %s; its audit log shows %d sync attempts by %d informers (%d informers attempted more than they may complete: attempts the server ended before their initial events, or relists)",
			round(r.At), round(r.For), strings.Join(counts, ", "), r.Syncs, r.Informers, len(r.Excess)))
		parts = append(parts, r.Excess...)
	}
	c.Detail = strings.Join(parts, "; ")
	return c, true
}

// DelayEvidence is what the API server's audit log shows of one delay
// fault: the requests of its victim (any incarnation) received from the
// fault's start until its held bytes and what queued behind them were
// delivered (twice the delay) and answered (a retry period more).
type DelayEvidence struct {
	// Fault is "delay" or "partition".
	Fault   string
	Replica string
	// At is when the delay began, into the run.
	At time.Duration
	// Refused counts its writes to shard resources the fencing policy
	// denied; Stray those committed outside its tenure; Committed all of
	// them it committed (in its tenure: a Lease that had not moved yet, or
	// its own again after the delay).
	Refused, Stray, Committed int
	// LeaseConflicts counts its writes of the ring's Leases answered 409
	// Conflict: renewals of Leases others had written meanwhile.
	LeaseConflicts int
}

func (d DelayEvidence) String() string {
	return fmt.Sprintf("%s of %s at %s: the API server received, late, %d of its shard writes refused by the %s policy and %d committed (%d outside its tenure), and %d of its Lease writes refused with 409 Conflict (renewals of Leases written by others meanwhile)",
		d.Fault, d.Replica, round(d.At), d.Refused, audit.FencingPolicy, d.Committed, d.Stray, d.LeaseConflicts)
}

// Writes is the number of committed replica writes to shard resources.
func (w *WriteEvidence) Writes() int {
	n := 0
	for _, c := range w.Committed {
		n += c
	}
	return n
}

// evidenceFor says what the write evidence reads of a run: the API
// server's audit log, whose Leases grant the shards, whether the fencing
// policy was bound, and the faults that held a victim's requests on the
// wire (delays, partitions) to account for.
type evidenceFor struct {
	log     string
	check   audit.CheckOptions
	fencing string
	held    []heldWindow
	// heldSpan is how long after such a fault's start its victim's
	// requests are counted as the fault's.
	heldSpan time.Duration
	// restarts are the API server restarts; each one's relists are counted
	// until restartSpan after it settled (the chaos interval: the next
	// fault comes later).
	restarts    []apiServerRestart
	restartSpan time.Duration
	begin       time.Time
}

// writeEvidence reads the API server's audit log and checks every
// committed replica write in it against the ring's shard Leases.
func writeEvidence(ev evidenceFor) *WriteEvidence {
	path, opts := ev.log, ev.check
	w := &WriteEvidence{Fencing: ev.fencing}
	if path == "" {
		return w
	}
	w.Log = filepath.Base(path)
	l, err := audit.ReadAPILogFile(path)
	if err != nil {
		w.Error = fmt.Sprintf("reading the API server's audit log: %v", err)
		return w
	}
	e := audit.CheckExclusive(l, opts)
	w.Events, w.Committed, w.LeaseWrites = l.Events, e.Committed, e.LeaseWrites
	w.Refused, w.Stray, w.Unattributed = len(e.Refused), len(e.Stray), len(e.Unattributed)
	for i, x := range e.Stray {
		if i == maxExamples {
			break
		}
		w.Examples = append(w.Examples, "OUTSIDE A TENURE: "+x.String())
	}
	for i, x := range e.Unattributed {
		if i == maxExamples {
			break
		}
		w.Examples = append(w.Examples, "UNATTRIBUTED: "+x.String())
	}
	for _, d := range ev.held {
		w.Delays = append(w.Delays, heldEvidence(l, e, ev, d))
	}
	for _, sy := range l.Syncs {
		if sy.Holder != "" {
			w.Syncs++
		}
	}
	for _, x := range ev.restarts {
		to := x.Counted
		if to.IsZero() {
			to = x.Settled.Add(ev.restartSpan)
		}
		r := audit.CheckRelists(l, audit.RelistOptions{Ring: opts.Ring, LeaseNamespace: opts.LeaseNamespace, From: x.At, To: to})
		re := RelistEvidence{At: x.At.Sub(ev.begin), For: to.Sub(x.At), Syncs: r.Total(), Informers: len(r.Groups),
			Completed: x.Syncs.ByResource, Allowed: r.AllowedClusterWide, Others: r.OthersClusterWide, CountErr: x.CountErr}
		if x.Counted.IsZero() {
			re.CountErr = "not read: the run ended without closing the restart's window"
		}
		for i, g := range r.Excess {
			if i == maxExamples {
				re.Excess = append(re.Excess, fmt.Sprintf("%d more", len(r.Excess)-i))
				break
			}
			re.Excess = append(re.Excess, g.String())
		}
		w.Relists = append(w.Relists, re)
	}
	return w
}

// heldEvidence counts what the API server received from the victim of a
// fault that held its requests (a delay, a partition) while it lasted.
func heldEvidence(l *audit.APILog, e *audit.Exclusivity, ev evidenceFor, d heldWindow) DelayEvidence {
	out := DelayEvidence{Fault: d.kind.String(), Replica: d.replica, At: d.from.Sub(ev.begin)}
	to := d.from.Add(ev.heldSpan)
	of := func(w audit.Write) bool {
		return strings.HasPrefix(w.Holder, d.replica+"_") && !w.Received.Before(d.from) && !w.Received.After(to)
	}
	shardRes := map[string]bool{}
	for _, r := range audit.ShardWriteResources {
		shardRes[r] = true
	}
	for _, w := range l.Writes {
		if !of(w) {
			continue
		}
		switch {
		case w.Resource == "leases" && w.Namespace == ev.check.LeaseNamespace && w.Code == 409:
			out.LeaseConflicts++
		case shardRes[w.Resource] && w.Code >= 200 && w.Code < 300:
			out.Committed++
		}
	}
	for _, w := range e.Refused {
		if of(w) {
			out.Refused++
		}
	}
	for _, w := range e.Stray {
		if of(w) {
			out.Stray++
		}
	}
	return out
}

// check passes when the API server's audit log was read, shows replica
// writes and shard Lease writes to check them against, and every committed
// write was inside its writer's tenure. A log that was not read, or shows
// nothing to check, is "no data": a check that saw nothing proves nothing.
func (w *WriteEvidence) check(notChecked string) Check {
	var c Check
	switch {
	case w == nil || w.Log == "":
		c = noDataCheck(checkWrites, "the run read no API server audit log (a cluster of --kubeconfig needs --apiserver-audit-log), so no write was checked")
	case w.Error != "":
		c = noDataCheck(checkWrites, w.Error)
	case w.Writes() == 0 || w.LeaseWrites == 0:
		c = noDataCheck(checkWrites, fmt.Sprintf("the API server's audit log (%d events) shows %d committed replica writes to shard resources and %d shard Lease writes, so the check would prove nothing",
			w.Events, w.Writes(), w.LeaseWrites))
	default:
		c = Check{Name: checkWrites, Passed: w.Stray == 0 && w.Unattributed == 0,
			Detail: fmt.Sprintf("the API server's audit log (%d events): %d committed replica writes to shard resources (%s) checked against %d commits of the shard Leases: %d outside the writer's tenure, %d unattributed; %s",
				w.Events, w.Writes(), committedText(w.Committed), w.LeaseWrites, w.Stray, w.Unattributed, w.refusedText())}
		for _, x := range w.Examples {
			c.Detail += "; " + x
		}
		if n := w.Stray + w.Unattributed - len(w.Examples); n > 0 {
			c.Detail += fmt.Sprintf("; %d more", n)
		}
	}
	c.Detail += notChecked
	return c
}

// refusedText says what the fencing admission policy refused.
func (w *WriteEvidence) refusedText() string {
	return fmt.Sprintf("%d refused by the %s admission policy (%s)", w.Refused, audit.FencingPolicy, w.Fencing)
}

// How the fencing policy was in force, for WriteEvidence.Fencing.
const (
	fencingBound    = "bound by the run"
	fencingUnbound  = "left unbound (--no-fencing)"
	fencingClusters = "the cluster's"
	fencingNone     = "none: the replicas ran on the load tester's credentials"
)

// committedText lists committed writes by resource: "configmaps 10, configbindings/status 8".
func committedText(by map[string]int) string {
	parts := make([]string, 0, len(by))
	for _, res := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %d", res, by[res]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// evidence says what the write check reads of this run: the API server's
// audit log, the ring whose Leases grant the shards, the users the
// replicas authenticate as, whether the fencing policy was bound, and the
// delay faults.
func (rp reporter) evidence() evidenceFor {
	r := rp.r
	ev := evidenceFor{log: r.apiAuditLog, begin: r.begin}
	switch {
	case r.pods != nil:
		t := r.pods
		ev.check = audit.CheckOptions{Ring: t.ring, LeaseNamespace: t.namespace, ShardTable: replica.DefaultShardTable, ReplicaUsers: []string{serviceAccountUser(t.namespace, t.serviceAccount)}}
		ev.fencing = fencingClusters
	case r.fencing != nil:
		ev.check = audit.CheckOptions{Ring: Ring, LeaseNamespace: LeaseNamespace, ShardTable: replica.DefaultShardTable, ReplicaUsers: []string{serviceAccountUser(LeaseNamespace, replicaServiceAccount)}}
		ev.fencing = fencingBound
		if !r.fencing.enforced {
			ev.fencing = fencingUnbound
		}
	default:
		ev.check = audit.CheckOptions{Ring: Ring, LeaseNamespace: LeaseNamespace, ShardTable: replica.DefaultShardTable}
		ev.fencing = fencingNone
	}
	ev.held, ev.restarts = r.faults.record()
	ev.heldSpan = 2*r.opts.DelayFor + r.opts.RetryPeriod
	ev.restartSpan = r.opts.ChaosInterval
	return ev
}

// replicaServiceAccount is the ServiceAccount of deploy/base the replicas
// run as.
const replicaServiceAccount = "kshard"

// serviceAccountUser is the user name a ServiceAccount's tokens
// authenticate as.
func serviceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}
