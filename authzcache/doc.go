// Package authzcache keeps an authorization system off the reconcile path,
// as externalcache keeps the config center off it: a replica asks "may
// namespace N read domain D?" with Decide, which never blocks. An unknown
// question is checked asynchronously, in bulk (a Checker, e.g. SpiceDB's
// CheckBulkPermissions), through a rate limit, a circuit breaker and
// retries; the answer is kept, and OnChange tells the caller when it
// arrives or changes.
//
// Permissions are derived (a grant can come through a team, and a team's
// members change without any domain changing), so a change of the
// authorization system's relationships cannot be mapped to the decisions
// it touches. The invalidation is sound instead of precise: every change
// the Watcher reports makes every kept decision stale, and all of them are
// checked again, in bulk, at least as fresh as the change. A Watcher that
// fails (the system restarted and lost its revisions) makes them stale too,
// and they are checked again fully consistently once it answers. A stale
// decision is served as Stale, never as Fresh, so a caller can tell.
package authzcache
