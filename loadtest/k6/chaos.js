// chaos: the basic workload while a random kshard pod is deleted every
// CHAOS_INTERVAL, so shards keep moving between replicas under load. The
// SLOs are the same as basic.js: a handover that leaves objects unowned, or
// a replica that reconciles late, shows as a missed Ready or a latency p99
// above 5 s. kshard_pod_deletions counts what was deleted.
//
//   kubectl proxy --port 8001 &
//   k6 run -e OBJECTS=300 -e DURATION=5m -e CHAOS_INTERVAL=45s chaos.js
//
// CHAOS_GRACE_SECONDS=0 deletes pods without a grace period (a crash: their
// shards move only when their Leases expire) instead of a graceful stop.

import {
  commonOptions, createBinding, deleteRandomPod, loadSettings, requireStatefulSet, setupRun, teardownRun,
  updateBinding, workloadScenarios,
} from './lib/configbinding.js';

const settings = loadSettings();

const scenarios = workloadScenarios(settings);
// One pod deletion every CHAOS_INTERVAL while the updates run; the first at
// the start of the update phase.
scenarios.chaos = {
  executor: 'constant-arrival-rate',
  exec: 'killPod',
  rate: 1,
  timeUnit: `${settings.chaosInterval}s`,
  startTime: scenarios.update.startTime,
  duration: scenarios.update.duration,
  preAllocatedVUs: 1,
  maxVUs: 1,
};

export const options = commonOptions(settings, scenarios);
options.thresholds = Object.assign({}, options.thresholds, {
  // A chaos run that deleted nothing proves nothing.
  kshard_pod_deletions: ['count>=1'],
});

export function setup() {
  requireStatefulSet(settings);
  return setupRun(settings);
}

// create is the exec function of the create scenario.
export function create(data) {
  createBinding(settings, data);
}

// update is the exec function of the update scenario.
export function update(data) {
  updateBinding(settings, data);
}

// killPod is the exec function of the chaos scenario.
export function killPod() {
  deleteRandomPod(settings);
}

export function teardown(data) {
  teardownRun(settings, data);
}
