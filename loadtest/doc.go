// Package loadtest drives kshard with real processes on one machine and
// measures it: a control plane (or an existing cluster), the stand-in config
// center, and fleets of `kshard controller` replicas, under a load of
// ConfigBinding creates and spec updates, through scenarios such as crashes,
// rolling restarts, resync storms, config-center outages and autoscaling,
// and side by side against the baselines (sharding off, direct external
// calls, and cmd/plaincontroller, a controller-runtime controller with no
// kshard code) on the same control plane and objects.
//
// kshard's claims are numbers: heap per replica against a singleton, objects
// listed, handover times, calls saved by the cache, end-to-end latency. This
// package produces them reproducibly, with the exact command in every
// report, and fails (for the chaos and rolling-restart scenarios) when an
// invariant breaks under the faults it injects (kills, pauses past the
// Lease, Lease clocks off by more than a Lease, requests delayed on the wire
// past the Lease): the API server committing a write to a shard's objects
// outside its writer's tenure of the shard's Lease (by its own audit log;
// the sharded replicas run on pod-bound tokens under deploy/base's fencing
// policy, as on a cluster), two replicas reconciling
// one object at once with no pause to explain it, a generation never
// becoming Ready, a shard without an owner for longer than a lease duration
// plus a retry period, or a replica above its memory limit.
//
// A run (run.go) is the runner of a scenario's steps (scenario.go,
// scenarios/*.yaml) on a bench (bench.go: the cluster, the processes or
// pods, the config center, SpiceDB, Prometheus), with the fleets it
// started in a fleet log (fleetlog.go). The steps' actions are functions of
// the run (steps.go, scale.go, capacity.go), faults are injected and
// recorded by faults (chaos.go), a settle is decided by a settler
// (settle.go), every figure is a PromQL query (queries/*.yaml) that
// promServer evaluates (prometheus.go, queries.go), and a reporter
// assembles the report from what the run recorded (result.go, report.go)
// and checks the invariants against the API server's audit log and the
// Leases (audit.go, ring.go).
//
// loadtest/cmd/loadtest is this package plus flags; loadtest/README.md says what each
// scenario does and what each number means.
package loadtest
