package configcenter

import (
	"time"
)

// CallerHeader names the client on every request, so that the server can count calls per
// controller replica, load generator or test. A caller that is not a lower-case DNS label (or a
// key-like name) is counted as "invalid", and a missing one as "unknown", which keeps the metric's
// cardinality bounded.
const CallerHeader = "X-Kshard-Caller"

// Route names used as labels and in Stats.
const (
	RouteGetKey    = "get_key"
	RoutePutKey    = "put_key"
	RouteDeleteKey = "delete_key"
	RouteChanges   = "changes"
	RouteAdmin     = "admin"
	RouteUnknown   = "unknown"
)

// StatSeries is one counter of Stats: the requests with the same caller, domain, route and code.
type StatSeries struct {
	Caller string `json:"caller"`
	Domain string `json:"domain"`
	Route  string `json:"route"`
	Code   int    `json:"code"`
	Count  int64  `json:"count"`
}

// Stats summarises the requests the server answered since start or the last reset. It holds the
// same counts as /metrics in a form a test can assert on without parsing Prometheus text.
type Stats struct {
	Total int64 `json:"total"`
	// Routes is the count per route and status code (as a decimal string).
	Routes map[string]map[string]int64 `json:"routes"`
	// Series lists every caller/domain/route/code counter, sorted.
	Series []StatSeries `json:"series"`
}

// Count sums the series matching the filter; an empty string or a zero code matches anything.
func (s Stats) Count(caller, domain, route string, code int) int64 {
	var n int64
	for _, x := range s.Series {
		if (caller == "" || x.Caller == caller) && (domain == "" || x.Domain == domain) &&
			(route == "" || x.Route == route) && (code == 0 || x.Code == code) {
			n += x.Count
		}
	}
	return n
}

// RequestRecord is one answered request, kept in a bounded in-memory log so that tests can check
// the order and spacing of calls (for example that a client waited for Retry-After).
type RequestRecord struct {
	Arrived    time.Time     `json:"arrived"`
	Done       time.Time     `json:"done"`
	Caller     string        `json:"caller"`
	Method     string        `json:"method"`
	Route      string        `json:"route"`
	Domain     string        `json:"domain,omitempty"`
	Key        string        `json:"key,omitempty"`
	Code       int           `json:"code"`
	RetryAfter time.Duration `json:"retryAfter,omitempty"`
}
