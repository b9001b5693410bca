// Package standin is the stand-in config center: a real HTTP server for the configuration service
// kshard's controllers depend on, run by the sandbox, the tests, the load tester and
// cmd/configcenter.
//
// It exists so that every claim kshard makes about keeping an external service off the reconcile
// path can be tested and load-tested against a real HTTP server instead of a mock: it keeps domains
// of keys in memory with etcd-like revisions, serves a long-poll change feed per domain, injects
// latency, errors, 429s with Retry-After and outages on demand, and counts every call by caller,
// domain, route and status so that tests can assert how many calls a client really made. It speaks
// the API of package configcenter, whose types it shares.
package standin
