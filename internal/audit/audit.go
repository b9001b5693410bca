// Package audit checks the sharding invariants from two kinds of evidence:
//
//   - did two replicas reconcile one object at the same time (Overlaps)?
//     From what the replicas recorded: their audit logs
//     (sharding.AuditRecord, one JSON line at the start and end of each
//     reconcile), which the load tester reads from its replica processes'
//     files and the end-to-end suite from the pods' standard output.
//   - did the API server commit a write to a shard's objects outside its
//     writer's tenure of the shard's Lease (CheckExclusive)? From the API
//     server's own audit log (ReadAPILog), which the replicas do not write:
//     a check that cannot be satisfied by what the checked processes say
//     about themselves.
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
