// Package audit checks the sharding invariants from what the replicas
// recorded: their audit logs (sharding.AuditRecord, one JSON line at the
// start and end of each reconcile and at the end of each write a shard's
// hold granted) merged with the shard Leases' history. The load tester reads
// the logs from its replica processes' files, the end-to-end suite from the
// pods' standard output; both ask the same two questions here:
//
//   - did two replicas reconcile one object at the same time (Overlaps)?
//   - did a replica write a shard's objects outside its tenure of the
//     shard's Lease (StrayWrites)?
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/kshard/kshard/sharding"
)

// Interval is one reconcile of one object by one replica.
type Interval struct {
	Replica    string
	Start, End time.Time
	Generation int64
	// Open says the process died inside this reconcile; End is its death.
	Open bool
}

// Overlap is two reconciles of one object, by different replicas, that ran
// at the same time.
type Overlap struct {
	Object string
	A, B   Interval
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s: %s [%s, %s] and %s [%s, %s]", o.Object,
		o.A.Replica, o.A.Start.Format(time.StampMicro), o.A.End.Format(time.StampMicro),
		o.B.Replica, o.B.Start.Format(time.StampMicro), o.B.End.Format(time.StampMicro))
}

// Log is what the audit logs of a run say.
type Log struct {
	// ByObject are the reconcile intervals per object ("namespace/name").
	ByObject map[string][]Interval
	// Writes are the "write" records.
	Writes []sharding.AuditRecord
	// Records counts the audit lines read.
	Records int
}

// NewLog returns an empty Log to Add process instances' logs to.
func NewLog() *Log { return &Log{ByObject: map[string][]Interval{}} }

// Add reads the audit log of one process instance. A start without an end
// lasts until ended: when the process ended (killed or exited), or now for
// one still running. Lines that are not audit records — cut short by
// SIGKILL, or a pod's other output — are skipped.
func (d *Log) Add(r io.Reader, ended time.Time) error {
	// One process reconciles one object at a time (the work queue
	// guarantees it), so an end closes that object's open start.
	open := map[string]sharding.AuditRecord{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var rec sharding.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil || rec.Replica == "" {
			continue
		}
		obj := rec.Namespace + "/" + rec.Name
		switch rec.Event {
		case "start":
			open[obj] = rec
		case "end":
			if s, ok := open[obj]; ok {
				d.ByObject[obj] = append(d.ByObject[obj], Interval{Replica: rec.Replica, Start: s.Time, End: rec.Time, Generation: s.Generation})
				delete(open, obj)
			}
		case "write":
			d.Writes = append(d.Writes, rec)
		default:
			continue
		}
		d.Records++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading audit records: %w", err)
	}
	for obj, s := range open {
		d.ByObject[obj] = append(d.ByObject[obj], Interval{Replica: s.Replica, Start: s.Time, End: ended, Generation: s.Generation, Open: true})
	}
	return nil
}

// Overlaps returns every pair of intersecting intervals of one object on
// different replicas, sorted by object and time. Intervals that merely touch
// (one ends the instant the other starts) do not overlap.
func Overlaps(byObject map[string][]Interval) []Overlap {
	var found []Overlap
	for obj, ivs := range byObject {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].Start.Before(ivs[j].Start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].Start.Before(ivs[i].End); j++ {
				if ivs[i].Replica != ivs[j].Replica {
					found = append(found, Overlap{Object: obj, A: ivs[i], B: ivs[j]})
				}
			}
		}
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].Object != found[j].Object {
			return found[i].Object < found[j].Object
		}
		return found[i].A.Start.Before(found[j].A.Start)
	})
	return found
}

// LeaseVersion is a shard Lease's holder from an acquisition on, as written.
type LeaseVersion struct {
	// Holder is the holder identity, "<replica>_<incarnation>"; "" for a
	// released (or deleted) Lease.
	Holder string
	// Acquired is the Lease's acquire time on the acquirer's clock: taken
	// before its write, so no later than the moment the Lease changed hands.
	// For a release, when it was released; for a deletion, when a watch saw
	// it.
	Acquired time.Time
}

// Tenure is one holder's uninterrupted hold of a shard Lease.
type Tenure struct {
	// Holder is the holder identity, "<replica>_<incarnation>".
	Holder string
	// From is its acquire time; To the next holder's, or the release's;
	// zero while it lasts.
	From, To time.Time
}

// Tenures turns a shard Lease's history into its holders' tenures. A holder
// acquiring again what it holds (a new acquire time, the same identity)
// continues its tenure; a release ends it.
func Tenures(hist []LeaseVersion) []Tenure {
	var out []Tenure
	for _, v := range hist {
		if n := len(out); n > 0 && out[n-1].To.IsZero() {
			if out[n-1].Holder == v.Holder {
				continue
			}
			out[n-1].To = v.Acquired
		}
		if v.Holder != "" {
			out = append(out, Tenure{Holder: v.Holder, From: v.Acquired})
		}
	}
	return out
}

// writeTime is when a write reached the API server at the latest: when it
// returned, or when the hold it was granted under ended, if earlier (the
// write's context ended then, so it was sent before).
func writeTime(w sharding.AuditRecord) time.Time {
	if w.Until != nil && w.Until.Before(w.Time) {
		return *w.Until
	}
	return w.Time
}

// StrayWrite is a write outside every tenure of its replica on its shard:
// a write beside another replica's, which the Leases exist to prevent.
type StrayWrite struct {
	Write sharding.AuditRecord
	// At is when the write reached the API server at the latest; Holder is
	// the holder identity of the shard's Lease then, "" for none.
	At     time.Time
	Holder string
}

func (w StrayWrite) String() string {
	holder := w.Holder
	if holder == "" {
		holder = "nobody"
	}
	return fmt.Sprintf("%s/%s (shard %d) written by %s at %s, when the Lease was held by %s", w.Write.Namespace, w.Write.Name,
		w.Write.Shard, w.Write.Replica, w.At.Format(time.StampMicro), holder)
}

// StrayWrites returns the writes that reached the API server outside every
// tenure of their replica of their shard's Lease, in time order. A tenure
// runs from its acquire time, inclusive, to the next one's, exclusive.
func StrayWrites(writes []sharding.AuditRecord, tenures map[int32][]Tenure) []StrayWrite {
	var out []StrayWrite
	for _, w := range writes {
		at := writeTime(w)
		held, holder := false, ""
		for _, t := range tenures[w.Shard] {
			if at.Before(t.From) || (!t.To.IsZero() && !at.Before(t.To)) {
				continue
			}
			if sharding.HolderReplica(t.Holder) == w.Replica {
				held = true
				break
			}
			holder = t.Holder
		}
		if !held {
			out = append(out, StrayWrite{Write: w, At: at, Holder: holder})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// LateWrites counts the writes that returned after their hold ended: in
// flight when a pause (or a slow API server) outlasted the hold; their
// context ended with it.
func LateWrites(writes []sharding.AuditRecord) int {
	n := 0
	for _, w := range writes {
		if w.Until != nil && w.Time.After(*w.Until) {
			n++
		}
	}
	return n
}
