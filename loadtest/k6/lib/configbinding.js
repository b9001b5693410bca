// The ConfigBinding workload shared by basic.js and chaos.js: settings read
// from __ENV, the SLO thresholds, and the steps every virtual user takes
// against the Kubernetes API (through `kubectl proxy`): create a binding,
// change its keys, and poll it until its status shows that generation Ready.
//
// Everything here talks to the API server only, never to the controller or
// the config center, so the measured latency is what a user of kshard sees:
// from the write that changed the spec to the status that says it is done.

import http from 'k6/http';
import { check, sleep } from 'k6';
import exec from 'k6/execution';
import { Counter, Rate, Trend } from 'k6/metrics';

// The ConfigBinding API (api/v1alpha1: GroupVersion, and the CRD's plural in
// deploy/crd). The Go test of this folder sends the scripts' bodies to these
// paths on a real API server with deploy/crd installed.
export const GROUP = 'config.kshard.dev';
export const VERSION = 'v1alpha1';
export const PLURAL = 'configbindings';
export const KIND = 'ConfigBinding';

// RUN_LABEL marks every object a run creates, so that teardown deletes
// exactly those, even after an aborted run (`RUN_ID=<id>` to reuse one).
export const RUN_LABEL = 'loadtest.kshard.dev/run';

// seedDomain and seedKey name what `configcenter --seed-domains N
// --keys-per-domain K` creates (internal/configcenter SeedDomain, SeedKey):
// a binding to any other name would wait forever on KeyNotFound.
export function seedDomain(i) {
  return `domain-${i}`;
}

export function seedKey(j) {
  return `key-${j}`;
}

// The SLOs kshard is measured against (Kubernetes' API SLOs, and the spec
// change -> Ready SLO of the kubernetes-controller-sharding load tests):
// p99 spec change -> Ready within 5 s, p99 mutating API calls and p99 reads
// within 1 s, and every spec change Ready in the end. k6 exits non-zero
// (99) when one fails.
export const sloThresholds = {
  kshard_e2e_latency: ['p(99)<=5000'],
  'http_req_duration{kind:mutate}': ['p(99)<=1000'],
  'http_req_duration{kind:read}': ['p(99)<=1000'],
  kshard_ready: ['rate==1'],
  // Iterations dropped for want of free VUs mean the asked-for rate was not
  // delivered: the run measured a lighter load than it claims.
  dropped_iterations: ['count==0'],
};

// kshard_e2e_latency is the time from sending a spec change (create or
// update, tag op) to reading a status whose observedGeneration is at least
// that change's generation with Ready=True. Polling bounds its resolution
// to POLL_INTERVAL.
export const e2eLatency = new Trend('kshard_e2e_latency', true);

// kshard_ready counts, per spec change, whether its generation became Ready
// within READY_TIMEOUT (false also when the write itself failed).
export const readyRate = new Rate('kshard_ready');

// kshard_pod_deletions counts the controller pods chaos.js deleted.
export const podDeletions = new Counter('kshard_pod_deletions');

function envInt(name, def, min, max) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') {
    return def;
  }
  const v = Number(raw);
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new Error(`${name}=${JSON.stringify(raw)}: want an integer from ${min} to ${max}`);
  }
  return v;
}

function envNumber(name, def, min, max) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') {
    return def;
  }
  const v = Number(raw);
  if (!Number.isFinite(v) || v < min || v > max) {
    throw new Error(`${name}=${JSON.stringify(raw)}: want a number from ${min} to ${max}`);
  }
  return v;
}

const durationUnits = { ms: 0.001, s: 1, m: 60, h: 3600 };

// envSeconds reads a duration such as 90s, 5m, 1h or 250ms (a bare number
// is seconds) and returns seconds.
function envSeconds(name, def, min, max) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') {
    return def;
  }
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(String(raw).trim());
  const v = m ? Number(m[1]) * durationUnits[m[2] || 's'] : NaN;
  if (!(v >= min && v <= max)) {
    throw new Error(`${name}=${JSON.stringify(raw)}: want a duration from ${min}s to ${max}s, such as 90s or 5m`);
  }
  return v;
}

function envName(name, def) {
  const v = __ENV[name] === undefined || __ENV[name] === '' ? def : __ENV[name];
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(v) || v.length > 40) {
    throw new Error(`${name}=${JSON.stringify(v)}: want a DNS-1123 label of at most 40 characters`);
  }
  return v;
}

// loadSettings reads and checks every setting once, in the init context, so
// that a bad value stops the run before it starts, naming the variable.
export function loadSettings() {
  const s = {
    api: String(__ENV.K8S_API || 'http://127.0.0.1:8001').replace(/\/+$/, ''),
    namespace: envName('NAMESPACE', 'kshard-loadtest'),
    runId: __ENV.RUN_ID ? envName('RUN_ID', '') : '',
    objects: envInt('OBJECTS', 300, 1, 100000),
    createRate: envInt('CREATE_RATE', 20, 1, 10000),
    domains: envInt('DOMAINS', 50, 1, 100000),
    keysPerDomain: envInt('KEYS_PER_DOMAIN', 20, 2, 100000),
    keys: envInt('KEYS', 3, 1, 64),
    updatesPerMinute: envNumber('UPDATES_PER_MIN', 2, 0.01, 600),
    duration: envSeconds('DURATION', 300, 1, 6 * 3600),
    readyTimeout: envSeconds('READY_TIMEOUT', 60, 0.1, 3600),
    pollInterval: envSeconds('POLL_INTERVAL', 0.2, 0.01, 60),
    teardownTimeout: envSeconds('TEARDOWN_TIMEOUT', 60, 1, 3600),
    controllerNamespace: envName('KSHARD_NAMESPACE', 'kshard-system'),
    statefulSet: envName('KSHARD_STATEFULSET', 'kshard'),
    chaosInterval: envSeconds('CHAOS_INTERVAL', 60, 1, 3600),
    chaosGraceSeconds: __ENV.CHAOS_GRACE_SECONDS === undefined || __ENV.CHAOS_GRACE_SECONDS === ''
      ? null : envInt('CHAOS_GRACE_SECONDS', 0, 0, 3600),
  };
  if (!/^https?:\/\/[^/]+/.test(s.api)) {
    throw new Error(`K8S_API=${JSON.stringify(__ENV.K8S_API)}: want an http(s) URL such as http://127.0.0.1:8001 (kubectl proxy)`);
  }
  if (s.keys >= s.keysPerDomain) {
    throw new Error(`KEYS=${s.keys} must be below KEYS_PER_DOMAIN=${s.keysPerDomain}, so that every update changes the key set`);
  }
  s.createSeconds = Math.ceil(s.objects / s.createRate);
  s.updatesPerMinuteTotal = Math.max(1, Math.round(s.objects * s.updatesPerMinute));
  // Every iteration waits for Ready, so it may outlive its scenario's end by
  // up to READY_TIMEOUT: give it that long before k6 interrupts it.
  s.gracefulStop = `${Math.ceil(s.readyTimeout) + 10}s`;
  return s;
}

// arrivalVUs sizes an arrival-rate scenario: an iteration lasts about one
// spec-change-to-Ready latency, so rate × 10 s keeps up with twice the SLO.
function arrivalVUs(perSecond) {
  return {
    preAllocatedVUs: Math.max(1, Math.ceil(perSecond * 2)),
    maxVUs: Math.max(2, Math.ceil(perSecond * 10)),
  };
}

// workloadScenarios are the create and update phases: OBJECTS bindings at
// CREATE_RATE per second, then UPDATES_PER_MIN key changes per binding per
// minute for DURATION.
export function workloadScenarios(s) {
  return {
    create: Object.assign({
      executor: 'constant-arrival-rate',
      exec: 'create',
      rate: s.createRate,
      timeUnit: '1s',
      duration: `${s.createSeconds}s`,
      gracefulStop: s.gracefulStop,
    }, arrivalVUs(s.createRate)),
    update: Object.assign({
      executor: 'constant-arrival-rate',
      exec: 'update',
      rate: s.updatesPerMinuteTotal,
      timeUnit: '1m',
      startTime: `${s.createSeconds}s`,
      duration: `${Math.ceil(s.duration)}s`,
      gracefulStop: s.gracefulStop,
    }, arrivalVUs(s.updatesPerMinuteTotal / 60)),
  };
}

// commonOptions are the k6 options both scripts share.
export function commonOptions(s, scenarios) {
  return {
    scenarios,
    thresholds: sloThresholds,
    setupTimeout: '2m',
    teardownTimeout: `${Math.ceil(s.teardownTimeout) + 60}s`,
    summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'max'],
  };
}

function params(kind, name, extra) {
  return Object.assign({ headers: { Accept: 'application/json' }, tags: { kind, name } }, extra || {});
}

function mutateParams(name, contentType, extra) {
  const p = params('mutate', name, extra);
  p.headers['Content-Type'] = contentType;
  return p;
}

// collectionPath and objectPath are the URLs of the run's ConfigBindings.
export function collectionPath(s) {
  return `${s.api}/apis/${GROUP}/${VERSION}/namespaces/${s.namespace}/${PLURAL}`;
}

export function objectPath(s, name) {
  return `${collectionPath(s)}/${name}`;
}

function describe(res) {
  let msg = res.body ? String(res.body) : '';
  try {
    msg = res.json().message || msg;
  } catch (e) {
    // not JSON: keep the raw body
  }
  return `HTTP ${res.status}${res.error ? ` (${res.error})` : ''}: ${msg.slice(0, 300)}`;
}

// bindingName is the name of the i-th binding of a run.
export function bindingName(runId, i) {
  return `lt-${runId}-${i}`;
}

// bindingKeys are the keys of binding i after `round` updates: a window of
// KEYS seeded keys that moves by one each round, so each update changes the
// spec (a new generation) and keeps the keys unique.
export function bindingKeys(s, i, round) {
  const keys = [];
  for (let k = 0; k < s.keys; k++) {
    keys.push(seedKey((i + round + k) % s.keysPerDomain));
  }
  return keys;
}

// keysPatch is the merge patch that gives binding i the keys of round
// `round`: it replaces the whole list, as a merge patch does with arrays.
export function keysPatch(s, i, round) {
  return { spec: { keys: bindingKeys(s, i, round) } };
}

// binding is the i-th object of a run; domains are spread uniformly.
export function binding(s, runId, i) {
  const name = bindingName(runId, i);
  return {
    apiVersion: `${GROUP}/${VERSION}`,
    kind: KIND,
    metadata: { name, namespace: s.namespace, labels: { [RUN_LABEL]: runId } },
    spec: {
      domain: seedDomain(i % s.domains),
      keys: bindingKeys(s, i, 0),
      target: { configMapName: `${name}-config` },
    },
  };
}

function readyCondition(obj) {
  const conds = (obj.status && obj.status.conditions) || [];
  for (const c of conds) {
    if (c.type === 'Ready') {
      return c;
    }
  }
  return null;
}

// isReadyAt reports whether obj's status says generation gen (or a later
// one) is Ready.
export function isReadyAt(obj, gen) {
  const st = obj.status || {};
  const c = readyCondition(obj);
  return (st.observedGeneration || 0) >= gen && c !== null && c.status === 'True' &&
    (c.observedGeneration === undefined || c.observedGeneration >= gen);
}

// waitReady polls binding name until its status shows generation gen Ready,
// and records the time since start (ms since the epoch) as one spec change.
export function waitReady(s, name, gen, start, op) {
  const deadline = start + s.readyTimeout * 1000;
  let last = 'never read';
  for (;;) {
    const res = http.get(objectPath(s, name), params('read', 'get configbinding'));
    if (res.status === 200) {
      const obj = res.json();
      if (isReadyAt(obj, gen)) {
        e2eLatency.add(Date.now() - start, { op });
        readyRate.add(true, { op });
        return true;
      }
      const c = readyCondition(obj);
      last = c ? `Ready=${c.status} reason=${c.reason} observedGeneration=${(obj.status || {}).observedGeneration}` : 'no Ready condition';
    } else {
      last = describe(res);
    }
    if (Date.now() >= deadline) {
      readyRate.add(false, { op });
      console.warn(`${name} generation ${gen} not Ready after ${s.readyTimeout}s (${op}): ${last}`);
      return false;
    }
    sleep(s.pollInterval);
  }
}

// createBinding creates the binding of this iteration and waits for it to
// become Ready.
export function createBinding(s, data) {
  const i = exec.scenario.iterationInTest;
  if (i >= s.objects) {
    return; // an arrival-rate scenario may start a few more iterations than asked
  }
  const obj = binding(s, data.runId, i);
  const start = Date.now();
  const res = http.post(collectionPath(s), JSON.stringify(obj), mutateParams('create configbinding', 'application/json'));
  if (!check(res, { 'create: 201 Created': (r) => r.status === 201 })) {
    readyRate.add(false, { op: 'create' });
    console.warn(`creating ${obj.metadata.name}: ${describe(res)}`);
    return;
  }
  waitReady(s, obj.metadata.name, res.json().metadata.generation, start, 'create');
}

// updateBinding changes the keys of one binding, round robin over all of
// them, and waits for the new generation to become Ready.
export function updateBinding(s, data) {
  const n = exec.scenario.iterationInTest;
  const i = n % s.objects;
  const round = Math.floor(n / s.objects) + 1;
  const name = bindingName(data.runId, i);
  const patch = keysPatch(s, i, round);
  const start = Date.now();
  const res = http.patch(objectPath(s, name), JSON.stringify(patch), mutateParams('update configbinding', 'application/merge-patch+json'));
  if (!check(res, { 'update: 200 OK': (r) => r.status === 200 })) {
    readyRate.add(false, { op: 'update' });
    console.warn(`updating ${name}: ${describe(res)}`);
    return;
  }
  waitReady(s, name, res.json().metadata.generation, start, 'update');
}

// podDeleteOptions is the body of a pod deletion: null keeps the pod's own
// grace period, CHAOS_GRACE_SECONDS=0 makes the deletion a crash.
export function podDeleteOptions(s) {
  return s.chaosGraceSeconds === null ? null
    : { apiVersion: 'v1', kind: 'DeleteOptions', gracePeriodSeconds: s.chaosGraceSeconds };
}

// deleteRandomPod deletes one random pod of the kshard StatefulSet, the way
// a node failure or an eviction would; the StatefulSet recreates it.
// CHAOS_GRACE_SECONDS=0 makes it a crash instead of a graceful stop.
export function deleteRandomPod(s) {
  const stsPath = `${s.api}/apis/apps/v1/namespaces/${s.controllerNamespace}/statefulsets/${s.statefulSet}`;
  const sts = http.get(stsPath, params('read', 'get statefulset'));
  if (!check(sts, { 'chaos: StatefulSet read': (r) => r.status === 200 })) {
    console.warn(`reading StatefulSet ${s.controllerNamespace}/${s.statefulSet}: ${describe(sts)}`);
    return;
  }
  const replicas = sts.json().spec.replicas || 0;
  if (replicas < 1) {
    console.warn(`StatefulSet ${s.controllerNamespace}/${s.statefulSet} has no replicas: nothing to delete`);
    return;
  }
  const pod = `${s.statefulSet}-${Math.floor(Math.random() * replicas)}`;
  const opts = podDeleteOptions(s);
  const body = opts === null ? null : JSON.stringify(opts);
  // 404: the pod was deleted a moment ago and is not back yet; not an error.
  const res = http.del(`${s.api}/api/v1/namespaces/${s.controllerNamespace}/pods/${pod}`, body,
    mutateParams('delete pod', 'application/json', { responseCallback: http.expectedStatuses(200, 202, 404) }));
  if (res.status === 200 || res.status === 202) {
    podDeletions.add(1, { pod });
    console.log(`chaos: deleted pod ${s.controllerNamespace}/${pod}`);
  } else if (res.status !== 404) {
    check(res, { 'chaos: pod deleted': () => false });
    console.warn(`deleting pod ${s.controllerNamespace}/${pod}: ${describe(res)}`);
  }
}

// requireStatefulSet fails setup when the kshard StatefulSet is missing, so
// that a chaos run cannot pass without killing anything.
export function requireStatefulSet(s) {
  const res = http.get(`${s.api}/apis/apps/v1/namespaces/${s.controllerNamespace}/statefulsets/${s.statefulSet}`,
    params('read', 'get statefulset', { responseCallback: http.expectedStatuses(200, 404) }));
  if (res.status !== 200) {
    throw new Error(`StatefulSet ${s.controllerNamespace}/${s.statefulSet} not readable at ${s.api}: ${describe(res)}; ` +
      'deploy kshard first (make deploy) or set KSHARD_NAMESPACE and KSHARD_STATEFULSET');
  }
  const sts = res.json();
  console.log(`StatefulSet ${s.controllerNamespace}/${s.statefulSet}: ${sts.status.readyReplicas || 0}/${sts.spec.replicas} replicas ready`);
}

// namespaceObject is the namespace setupRun creates when it is missing.
export function namespaceObject(s) {
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name: s.namespace } };
}

// setupRun checks that the API server serves ConfigBindings, makes the
// namespace the objects go to, and picks the run's id.
export function setupRun(s) {
  const disco = http.get(`${s.api}/apis/${GROUP}/${VERSION}`,
    params('read', 'discovery', { responseCallback: http.expectedStatuses(200, 404) }));
  if (disco.status !== 200) {
    throw new Error(`${GROUP}/${VERSION} is not served at ${s.api} (${describe(disco)}): ` +
      'is `kubectl proxy --port 8001` running, and is deploy/crd installed?');
  }
  const served = (disco.json().resources || []).some((r) => r.name === PLURAL && r.namespaced);
  if (!served) {
    throw new Error(`${GROUP}/${VERSION} at ${s.api} has no namespaced ${PLURAL} resource: install deploy/crd`);
  }

  let createdNamespace = false;
  const nsPath = `${s.api}/api/v1/namespaces`;
  const ns = http.get(`${nsPath}/${s.namespace}`,
    params('read', 'get namespace', { responseCallback: http.expectedStatuses(200, 404) }));
  if (ns.status === 404) {
    const created = http.post(nsPath, JSON.stringify(namespaceObject(s)),
      mutateParams('create namespace', 'application/json'));
    if (created.status !== 201) {
      throw new Error(`creating namespace ${s.namespace}: ${describe(created)}`);
    }
    createdNamespace = true;
  } else if (ns.status !== 200) {
    throw new Error(`reading namespace ${s.namespace}: ${describe(ns)}`);
  }

  const runId = s.runId || Date.now().toString(36);
  console.log(`run ${runId}: ${s.objects} ConfigBindings in ${s.namespace} over ${s.domains} domains, ` +
    `${s.keys} of ${s.keysPerDomain} keys each; label ${RUN_LABEL}=${runId}`);
  return { runId, createdNamespace };
}

// teardownRun deletes the run's objects (their ConfigMaps go with them by
// owner reference), and the namespace when setup made it, then waits a
// bounded time until none is left.
export function teardownRun(s, data) {
  const selector = encodeURIComponent(`${RUN_LABEL}=${data.runId}`);
  const res = http.del(`${collectionPath(s)}?labelSelector=${selector}`, null,
    mutateParams('delete configbindings', 'application/json'));
  check(res, { 'teardown: test objects deleted': (r) => r.status === 200 });
  if (res.status !== 200) {
    console.warn(`deleting the run's ConfigBindings: ${describe(res)}`);
  }
  if (data.createdNamespace) {
    const nsRes = http.del(`${s.api}/api/v1/namespaces/${s.namespace}`, null,
      mutateParams('delete namespace', 'application/json'));
    check(nsRes, { 'teardown: namespace deleted': (r) => r.status === 200 || r.status === 202 });
  }
  const deadline = Date.now() + s.teardownTimeout * 1000;
  for (;;) {
    const list = http.get(`${collectionPath(s)}?labelSelector=${selector}&limit=1`,
      params('read', 'list configbindings', { responseCallback: http.expectedStatuses(200, 404) }));
    const left = list.status === 200 ? list.json().items.length : 0;
    if (left === 0) {
      console.log(`run ${data.runId}: test objects deleted`);
      return;
    }
    if (Date.now() >= deadline) {
      console.warn(`run ${data.runId}: ConfigBindings still present ${s.teardownTimeout}s after deletion; delete them with ` +
        `kubectl delete configbindings -n ${s.namespace} -l ${RUN_LABEL}=${data.runId}`);
      return;
    }
    sleep(1);
  }
}
