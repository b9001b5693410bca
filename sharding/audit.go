package sharding

import (
	"encoding/json"
	"io"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AuditRecord is one line of the audit log: the start or the end of one
// reconcile. Merged across replicas, the log proves (or disproves) that no
// two replicas reconciled one object at the same time. (Whether a replica
// wrote outside its tenure is not asked of its own records: the API server's
// audit log says which writes it committed, internal/audit.)
type AuditRecord struct {
	Time time.Time `json:"time"`
	// Event is "start" or "end".
	Event      string `json:"event"`
	Replica    string `json:"replica"`
	Shard      int32  `json:"shard"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	// Outcome, on an end, is what the reconcile asked of its queue: "done",
	// "requeue", "requeue after <duration>", or "error" (retried with the
	// rate limiter's backoff). A run of ends that never says "done" is an
	// object reconciled in a loop.
	Outcome string `json:"outcome,omitempty"`
}

// outcome names what a reconcile's result asks of the work queue.
func outcome(res reconcile.Result, err error) string {
	switch {
	case err != nil:
		return "error"
	case res.RequeueAfter > 0:
		return "requeue after " + res.RequeueAfter.String()
	case res.Requeue: //nolint:staticcheck // the deprecated field still requeues
		return "requeue"
	}
	return "done"
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

// auditedReconcile is one reconcile of the audit log.
type auditedReconcile struct {
	log *auditLog
	rec AuditRecord
}

func (a *auditedReconcile) record(event, outcome string) {
	rec := a.rec
	rec.Event, rec.Time, rec.Outcome = event, time.Now(), outcome
	a.log.write(rec)
}
