package loadtest

import (
	"sort"

	"github.com/kshard/kshard/internal/audit"
)

// LatencySplit divides end-to-end latency at the start of the reconcile
// that did the work: before it (the write reaching the API server, its
// watch event reaching the replica, the wait in the work queue) and after it
// (the reconcile's reads and writes, and the status write's watch event
// reaching the load tester). Percentiles of each part are over the same
// updates, so they show which part grows when end-to-end latency does.
type LatencySplit struct {
	// Joined is the updates whose reconcile the audit log has; the rest had
	// none (a generation overtaken before it was reconciled).
	Joined, Updates int
	// ToReconcile is from the write to its reconcile's start; FromReconcile
	// from there to the load tester seeing Ready.
	ToReconcile, FromReconcile LatencySummary
}

// splitLatencies joins update samples with the audit log's reconciles: an
// update of generation g is done by the first reconcile of the object that
// started after the write, and before Ready was seen, reading generation g
// or later.
func splitLatencies(samples []latencySample, byObject map[string][]audit.Interval) *LatencySplit {
	sorted := map[string][]audit.Interval{}
	for k, iv := range byObject {
		iv = append([]audit.Interval(nil), iv...)
		sort.Slice(iv, func(i, j int) bool { return iv[i].Start.Before(iv[j].Start) })
		sorted[k] = iv
	}
	split := &LatencySplit{Updates: len(samples)}
	var before, after durations
	for _, s := range samples {
		sent := s.Done.Add(-s.Latency)
		for _, iv := range sorted[s.Key] {
			if iv.Start.Before(sent) || iv.Generation < s.Gen || iv.Start.After(s.Done) {
				continue
			}
			before = append(before, iv.Start.Sub(sent))
			after = append(after, s.Done.Sub(iv.Start))
			split.Joined++
			break
		}
	}
	if split.Joined == 0 {
		return nil
	}
	split.ToReconcile, split.FromReconcile = before.summary(), after.summary()
	return split
}
