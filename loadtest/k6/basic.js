// basic: the steady workload against kshard on a cluster. OBJECTS
// ConfigBindings spread over DOMAINS seeded config-center domains are
// created at CREATE_RATE per second, then each gets UPDATES_PER_MIN key
// changes per minute for DURATION; every create and update is followed to
// Ready, and the run fails when an SLO in lib/configbinding.js is missed.
//
//   kubectl proxy --port 8001 &
//   k6 run -e OBJECTS=300 -e DURATION=5m basic.js
//
// README.md lists every variable.

import {
  commonOptions, createBinding, loadSettings, setupRun, teardownRun, updateBinding, workloadScenarios,
} from './lib/configbinding.js';

const settings = loadSettings();

export const options = commonOptions(settings, workloadScenarios(settings));

export function setup() {
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

export function teardown(data) {
  teardownRun(settings, data);
}
