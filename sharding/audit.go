package sharding

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// AuditRecord is one line of the audit log: the start or the end of one
// reconcile, or a write it made. Merged across replicas, the log proves (or
// disproves) that no two replicas reconciled one object at the same time,
// and that no replica wrote after another took the shard over.
type AuditRecord struct {
	Time time.Time `json:"time"`
	// Event is "start", "write" (a write granted by WriteContext ended: it
	// reached the API server, if at all, by Time) or "end".
	Event      string `json:"event"`
	Replica    string `json:"replica"`
	Shard      int32  `json:"shard"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	// Until is, for a write, when the hold it was granted under ended: the
	// write was sent before it, so it reached the API server by the earlier
	// of Time and Until (plus transit, which LeaseDuration − RenewDeadline
	// covers).
	Until *time.Time `json:"until,omitempty"`
}

// auditLog writes AuditRecords as JSON lines, one write per record so lines
// from concurrent reconciles never interleave.
type auditLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (a *auditLog) write(rec AuditRecord) {
	if a == nil {
		return
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, _ = a.w.Write(append(line, '\n'))
}

// auditKey is the context key of the reconcile being audited.
type auditKey struct{}

// auditedReconcile is one reconcile of the audit log, carried in its
// context so WriteContext can record its writes.
type auditedReconcile struct {
	log *auditLog
	rec AuditRecord
}

func (a *auditedReconcile) record(event string, until *time.Time) {
	rec := a.rec
	rec.Event, rec.Time, rec.Until = event, time.Now(), until
	a.log.write(rec)
}

func (a *auditedReconcile) wrote(until time.Time) { a.record("write", &until) }
