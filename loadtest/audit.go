package loadtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/kshard/kshard/sharding"
)

// Audit logs are how the load tester proves the sharding invariant "at most
// one replica reconciles an object at any moment": every replica process
// writes a JSON line (sharding.AuditRecord) at the start and the end of each
// reconcile (`kshard controller --audit-log`), each process instance to its
// own file, and the merged intervals of one object must never intersect
// across replicas.

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

// reconcileInterval is one reconcile of one object by one replica.
type reconcileInterval struct {
	Replica    string
	Start, End time.Time
	Generation int64
	// Open says the process died inside this reconcile; End is its death.
	Open bool
}

// overlap is two reconciles of one object, by different replicas, that ran
// at the same time.
type overlap struct {
	Object string
	A, B   reconcileInterval
}

func (o overlap) String() string {
	return fmt.Sprintf("%s: %s [%s, %s] and %s [%s, %s]", o.Object,
		o.A.Replica, o.A.Start.Format(time.StampMicro), o.A.End.Format(time.StampMicro),
		o.B.Replica, o.B.Start.Format(time.StampMicro), o.B.End.Format(time.StampMicro))
}

// readAuditIntervals merges audit files into reconcile intervals per object
// ("namespace/name"). A start without an end lasts until its process ended,
// or until now for a process still running. Lines cut short by SIGKILL are
// skipped. records counts the lines read.
func readAuditIntervals(files []auditFile, now time.Time) (byObject map[string][]reconcileInterval, records int, err error) {
	byObject = map[string][]reconcileInterval{}
	for _, af := range files {
		f, err := os.Open(af.Path)
		if err != nil {
			return nil, records, fmt.Errorf("reading audit log %s: %w", af.Path, err)
		}
		n, err := addIntervals(byObject, f, af, now)
		records += n
		_ = f.Close()
		if err != nil {
			return nil, records, fmt.Errorf("reading audit log %s: %w", af.Path, err)
		}
	}
	return byObject, records, nil
}

// addIntervals reads one process instance's audit log.
func addIntervals(byObject map[string][]reconcileInterval, r io.Reader, af auditFile, now time.Time) (int, error) {
	// One process reconciles one object at a time (the work queue
	// guarantees it), so an end closes that object's open start.
	open := map[string]sharding.AuditRecord{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		var rec sharding.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			continue // a line cut by SIGKILL
		}
		n++
		obj := rec.Namespace + "/" + rec.Name
		switch rec.Event {
		case "start":
			open[obj] = rec
		case "end":
			if s, ok := open[obj]; ok {
				byObject[obj] = append(byObject[obj], reconcileInterval{Replica: rec.Replica, Start: s.Time, End: rec.Time, Generation: s.Generation})
				delete(open, obj)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return n, err
	}
	end := af.Ended
	if end.IsZero() {
		end = now
	}
	for obj, s := range open {
		byObject[obj] = append(byObject[obj], reconcileInterval{Replica: s.Replica, Start: s.Time, End: end, Generation: s.Generation, Open: true})
	}
	return n, nil
}

// findOverlaps returns every pair of intersecting intervals of one object on
// different replicas, sorted by object and time. Intervals that merely touch
// (one ends the instant the other starts) do not overlap.
func findOverlaps(byObject map[string][]reconcileInterval) []overlap {
	var found []overlap
	for obj, ivs := range byObject {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].Start.Before(ivs[j].Start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].Start.Before(ivs[i].End); j++ {
				if ivs[i].Replica != ivs[j].Replica {
					found = append(found, overlap{Object: obj, A: ivs[i], B: ivs[j]})
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
