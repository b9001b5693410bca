package sharding

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// AuditRecord is one line of the audit log: the start or the end of one
// reconcile. Merged across replicas, the log proves (or disproves) that no
// two replicas reconciled one object at the same time.
type AuditRecord struct {
	Time       time.Time `json:"time"`
	Event      string    `json:"event"` // "start" or "end"
	Replica    string    `json:"replica"`
	Shard      int32     `json:"shard"`
	Namespace  string    `json:"namespace"`
	Name       string    `json:"name"`
	Generation int64     `json:"generation"`
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
