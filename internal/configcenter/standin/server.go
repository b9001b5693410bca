package standin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kshard/kshard/internal/configcenter"
)

// MaxBodyBytes bounds every request body the server reads.
const MaxBodyBytes = 1 << 20

// Options configures a Server. The zero value plus an address is a working server.
type Options struct {
	// Addr is the TCP address to listen on. Default "127.0.0.1:0": loopback, any free port.
	Addr string
	// Token, when set, is the bearer token every route except /metrics and /healthz requires.
	Token string
	// Seed is written before the server starts answering.
	Seed configcenter.SeedOptions
	// Faults are the faults injected from the start.
	Faults configcenter.Faults
	// MaxPollTimeout bounds how long a change-feed poll may wait. Default 30s.
	MaxPollTimeout time.Duration
	// DefaultPollTimeout is the wait of a poll that names none. Default 25s.
	DefaultPollTimeout time.Duration
	// MaxChanges bounds the changes in one change-feed answer; the rest follow in the next poll.
	// Default 1000.
	MaxChanges int
	// RequestLogSize is how many recent requests /admin/requests keeps. Default 10000.
	RequestLogSize int
	// Log receives the server's logs. Default: discard.
	Log logr.Logger
}

func (o *Options) setDefaults() {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.MaxPollTimeout <= 0 {
		o.MaxPollTimeout = 30 * time.Second
	}
	if o.DefaultPollTimeout <= 0 {
		o.DefaultPollTimeout = min(25*time.Second, o.MaxPollTimeout)
	}
	if o.MaxChanges <= 0 {
		o.MaxChanges = 1000
	}
	if o.RequestLogSize <= 0 {
		o.RequestLogSize = 10000
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
}

// Server is a running config center. It stops when the context given to Start is done or when
// Close or Shutdown is called.
type Server struct {
	opts   Options
	log    logr.Logger
	store  *store
	faults injector
	rec    *recorder
	ln     net.Listener
	srv    *http.Server

	// base is the context of every request; it is cancelled first on shutdown so that waiting
	// change-feed polls return at once instead of holding the shutdown for their full timeout.
	base       context.Context
	cancelBase context.CancelFunc
	served     chan struct{}
	// waiting counts change-feed polls waiting for a change.
	waiting atomic.Int64
	// fresh holds connections that have not sent a request yet, with when they were opened;
	// see Shutdown.
	freshMu  sync.Mutex
	fresh    map[net.Conn]time.Time
	stopOnce sync.Once
	stopErr  error
}

// Start seeds a server, starts listening and serves in the background until ctx is done.
func Start(ctx context.Context, opts Options) (*Server, error) {
	opts.setDefaults()
	s := &Server{opts: opts, log: opts.Log, store: newStore(), served: make(chan struct{})}
	if err := s.faults.set(opts.Faults); err != nil {
		return nil, err
	}
	if _, err := s.store.seed(opts.Seed); err != nil {
		return nil, err
	}
	s.rec = newRecorder(opts.RequestLogSize, s.store, &s.waiting)
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", opts.Addr, err)
	}
	s.ln = ln
	s.base, s.cancelBase = context.WithCancel(context.Background())
	s.srv = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      opts.MaxPollTimeout + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return s.base },
		ConnState:         s.trackConn,
	}
	s.fresh = map[net.Conn]time.Time{}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(err, "Serving stopped")
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.served:
		}
	}()
	s.log.Info("Config center listening", "url", s.URL(), "auth", opts.Token != "")
	return s, nil
}

// URL is the base URL clients use, for example http://127.0.0.1:40123.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close shuts the server down, giving in-flight requests up to five seconds.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown stops accepting requests, ends waiting change-feed polls and waits for in-flight
// requests until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.cancelBase()
		done := make(chan error, 1)
		go func() { done <- s.srv.Shutdown(ctx) }()
		// http.Server.Shutdown waits up to 5s for connections that never sent a request (a
		// client's spare dial); close those that stayed unused for a moment, so that shutdown
		// takes as long as the requests do.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case <-tick.C:
				s.closeFreshConns()
			}
		}
		if err != nil {
			s.stopErr = fmt.Errorf("shutting down the config center: %w", err)
			_ = s.srv.Close()
		}
		<-s.served
		s.log.Info("Config center stopped")
	})
	return s.stopErr
}

func (s *Server) trackConn(c net.Conn, state http.ConnState) {
	s.freshMu.Lock()
	defer s.freshMu.Unlock()
	if state == http.StateNew {
		s.fresh[c] = time.Now()
	} else {
		delete(s.fresh, c)
	}
}

func (s *Server) closeFreshConns() {
	s.freshMu.Lock()
	defer s.freshMu.Unlock()
	for c, opened := range s.fresh {
		if time.Since(opened) > 200*time.Millisecond {
			_ = c.Close()
			delete(s.fresh, c)
		}
	}
}

// Put writes a key in process, as a PUT would, without faults or accounting. Tests use it to
// change data while injecting an outage.
func (s *Server) Put(domain, key, value string) (configcenter.Value, error) {
	if err := configcenter.ValidateDomain(domain); err != nil {
		return configcenter.Value{}, err
	}
	if err := configcenter.ValidateKey(key); err != nil {
		return configcenter.Value{}, err
	}
	return s.store.put(domain, key, value), nil
}

// WaitingPolls is the number of change-feed polls waiting for a change, so that tests can make
// a change while a poll waits.
func (s *Server) WaitingPolls() int64 { return s.waiting.Load() }

// Delete removes a key in process, as a DELETE would.
func (s *Server) Delete(domain, key string) (int64, error) {
	return s.store.delete(domain, key)
}

// Seed writes synthetic data in process, as POST /admin/seed would.
func (s *Server) Seed(o configcenter.SeedOptions) (configcenter.SeedResult, error) {
	return s.store.seed(o)
}

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f configcenter.Faults) error { return s.faults.set(f) }

// Faults returns the injected faults.
func (s *Server) Faults() configcenter.Faults { return s.faults.get() }

// Stats returns the request counts since start or the last ResetStats.
func (s *Server) Stats() configcenter.Stats { return s.rec.stats() }

// ResetStats clears Stats and the request log (not the Prometheus counters).
func (s *Server) ResetStats() { s.rec.reset() }

// Requests returns the logged requests that match, oldest first; nil matches all.
func (s *Server) Requests(match func(configcenter.RequestRecord) bool) []configcenter.RequestRecord {
	return s.rec.requests(match)
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/domains/{domain}/keys/{key}", s.serveKey)
	mux.HandleFunc("/v1/domains/{domain}/changes", s.serveChanges)
	mux.HandleFunc("/admin/seed", s.serveSeed)
	mux.HandleFunc("/admin/faults", s.serveFaults)
	mux.HandleFunc("/admin/stats", s.serveStats)
	mux.HandleFunc("/admin/stats/reset", s.serveStatsReset)
	mux.HandleFunc("/admin/requests", s.serveRequests)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if !s.authorize(w, r) {
			return
		}
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.EscapedPath())
	})
	metrics := promhttp.HandlerFor(s.rec.registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			metrics.ServeHTTP(w, r)
			return
		case "/healthz":
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			return
		}
		sw := &statusWriter{ResponseWriter: w, rec: configcenter.RequestRecord{
			Arrived: time.Now(),
			Caller:  labelValue(r.Header.Get(configcenter.CallerHeader), "unknown"),
			Method:  r.Method,
			Route:   configcenter.RouteUnknown,
		}}
		defer func() {
			sw.rec.Done = time.Now()
			if sw.rec.Code == 0 {
				sw.rec.Code = http.StatusOK
			}
			s.rec.record(sw.rec)
		}()
		// ServeMux would redirect unclean paths (dot segments, double slashes); refuse them
		// instead, so that a path means exactly what it says.
		if p := r.URL.EscapedPath(); p == "" || strings.Contains(p, "//") || strings.Contains(p, "/./") ||
			strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || strings.HasSuffix(p, "/.") {
			writeError(sw, http.StatusBadRequest, "path must not contain empty, '.' or '..' segments")
			return
		}
		mux.ServeHTTP(sw, r)
	})
}

// statusWriter remembers the answer's status and the request's route for accounting.
type statusWriter struct {
	http.ResponseWriter
	rec configcenter.RequestRecord
}

func (w *statusWriter) WriteHeader(code int) {
	if w.rec.Code == 0 {
		w.rec.Code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.rec.Code == 0 {
		w.rec.Code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// describe labels the request for accounting once its handler knows what it is.
func describe(w http.ResponseWriter, route, domain, key string) {
	if sw, ok := w.(*statusWriter); ok {
		sw.rec.Route = route
		sw.rec.Domain = labelValue(domain, "")
		if key != "" {
			sw.rec.Key = labelValue(key, "")
		}
	}
}

func (s *Server) authorize(w http.ResponseWriter, r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.opts.Token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="configcenter"`)
	writeError(w, http.StatusUnauthorized, "a valid bearer token is required")
	return false
}

// injectFaults answers the request with an injected fault and reports false, or reports true
// when the handler should proceed.
func (s *Server) injectFaults(w http.ResponseWriter, r *http.Request) bool {
	rej := s.faults.apply(r.Context())
	if rej == nil {
		return true
	}
	if rej.retryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(rej.retryAfter))
		if sw, ok := w.(*statusWriter); ok {
			sw.rec.RetryAfter = rej.retryAfter
		}
	}
	writeError(w, rej.code, rej.message)
	return false
}

func (s *Server) serveKey(w http.ResponseWriter, r *http.Request) {
	route := map[string]string{
		http.MethodGet: configcenter.RouteGetKey, http.MethodPut: configcenter.RoutePutKey, http.MethodDelete: configcenter.RouteDeleteKey,
	}[r.Method]
	if route == "" {
		route = configcenter.RouteUnknown
	}
	describe(w, route, r.PathValue("domain"), r.PathValue("key"))
	if !s.authorize(w, r) {
		return
	}
	if route == configcenter.RouteUnknown {
		methodNotAllowed(w, "GET, PUT, DELETE")
		return
	}
	domain, key, err := configcenter.ParseKeyPath(r.URL.EscapedPath())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body configcenter.PutBody
	if r.Method == http.MethodPut {
		// Read the body before injecting faults: a rejected client must not be left writing.
		if !decodeBody(w, r, &body) {
			return
		}
		if body.Value == nil {
			writeError(w, http.StatusBadRequest, `"value" is required`)
			return
		}
	}
	if !s.injectFaults(w, r) {
		return
	}
	switch r.Method {
	case http.MethodGet:
		v, err := s.store.get(domain, key)
		if err != nil {
			writeJSON(w, http.StatusNotFound, configcenter.ErrorBody{Error: err.Error(), Reason: configcenter.ReasonNotFound})
			return
		}
		writeJSON(w, http.StatusOK, v)
	case http.MethodPut:
		writeJSON(w, http.StatusOK, s.store.put(domain, key, *body.Value))
	case http.MethodDelete:
		rev, err := s.store.delete(domain, key)
		if err != nil {
			writeJSON(w, http.StatusNotFound, configcenter.ErrorBody{Error: err.Error(), Reason: configcenter.ReasonNotFound})
			return
		}
		writeJSON(w, http.StatusOK, map[string]int64{"revision": rev})
	}
}

func (s *Server) serveChanges(w http.ResponseWriter, r *http.Request) {
	domain := r.PathValue("domain")
	describe(w, configcenter.RouteChanges, domain, "")
	if !s.authorize(w, r) {
		return
	}
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	if err := configcenter.ValidateDomain(domain); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	since, timeout, err := s.pollParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !s.injectFaults(w, r) {
		return
	}
	f := s.faults.get()
	if f.FailPolls {
		writeError(w, http.StatusGatewayTimeout, "injected: the proxy timed the poll out")
		return
	}
	if f.ShortPolls {
		writeJSON(w, http.StatusOK, configcenter.ChangeSet{Revision: since, Changes: []configcenter.Change{}, Epoch: s.store.epoch})
		return
	}
	answer := func(cs configcenter.ChangeSet) { writeJSON(w, http.StatusOK, cs) }
	if f.AlternateEpochs && s.faults.secondHistory(domain) {
		// The other history's answer: its own epoch with the same changes (a twin with the
		// same data, numbered alike, is the kindest case).
		answer = func(cs configcenter.ChangeSet) {
			cs.Epoch += "-twin"
			writeJSON(w, http.StatusOK, cs)
		}
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	for {
		cs, changed := s.store.changes(domain, since, s.opts.MaxChanges)
		if changed == nil || cs.Revision < since || timeout == 0 {
			answer(cs)
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			cs, _ = s.store.changes(domain, since, s.opts.MaxChanges)
			answer(cs)
			return
		case <-r.Context().Done():
			// The client left or the server is shutting down; 499-style accounting only.
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
}

// pollParams reads since (a revision, default 0) and timeout (a Go duration or whole seconds,
// default DefaultPollTimeout, capped at MaxPollTimeout).
func (s *Server) pollParams(r *http.Request) (since int64, timeout time.Duration, err error) {
	q := r.URL.Query()
	if v := q.Get("since"); v != "" {
		since, err = strconv.ParseInt(v, 10, 64)
		if err != nil || since < 0 {
			return 0, 0, fmt.Errorf("since %q must be a non-negative revision", v)
		}
	}
	timeout = s.opts.DefaultPollTimeout
	if v := q.Get("timeout"); v != "" {
		timeout, err = time.ParseDuration(v)
		if err != nil {
			secs, serr := strconv.ParseUint(v, 10, 32)
			if serr != nil {
				return 0, 0, fmt.Errorf("timeout %q must be a duration such as 25s", v)
			}
			timeout = time.Duration(secs) * time.Second
		}
		if timeout < 0 {
			return 0, 0, fmt.Errorf("timeout %q must not be negative", v)
		}
	}
	return since, min(timeout, s.opts.MaxPollTimeout), nil
}

func (s *Server) serveSeed(w http.ResponseWriter, r *http.Request) {
	describe(w, configcenter.RouteAdmin, "", "")
	if !s.authorize(w, r) {
		return
	}
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	var o configcenter.SeedOptions
	if !decodeBody(w, r, &o) {
		return
	}
	res, err := s.store.seed(o)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.log.Info("Seeded", "domains", o.Domains, "keysPerDomain", o.KeysPerDomain, "valueBytes", o.ValueBytes, "revision", res.Revision)
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) serveFaults(w http.ResponseWriter, r *http.Request) {
	describe(w, configcenter.RouteAdmin, "", "")
	if !s.authorize(w, r) {
		return
	}
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, s.faults.get())
	case http.MethodPut:
		var f configcenter.Faults
		if !decodeBody(w, r, &f) {
			return
		}
		if err := s.faults.set(f); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.log.Info("Faults changed", "faults", f)
		writeJSON(w, http.StatusOK, f)
	default:
		methodNotAllowed(w, "GET, PUT")
	}
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	describe(w, configcenter.RouteAdmin, "", "")
	if !s.authorize(w, r) {
		return
	}
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	writeJSON(w, http.StatusOK, s.rec.stats())
}

func (s *Server) serveStatsReset(w http.ResponseWriter, r *http.Request) {
	describe(w, configcenter.RouteAdmin, "", "")
	if !s.authorize(w, r) {
		return
	}
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	s.rec.reset()
	writeJSON(w, http.StatusOK, map[string]bool{"reset": true})
}

func (s *Server) serveRequests(w http.ResponseWriter, r *http.Request) {
	describe(w, configcenter.RouteAdmin, "", "")
	if !s.authorize(w, r) {
		return
	}
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	q := r.URL.Query()
	want := map[string]string{"caller": q.Get("caller"), "domain": q.Get("domain"), "key": q.Get("key"), "route": q.Get("route")}
	writeJSON(w, http.StatusOK, s.rec.requests(func(rec configcenter.RequestRecord) bool {
		have := map[string]string{"caller": rec.Caller, "domain": rec.Domain, "key": rec.Key, "route": rec.Route}
		for k, v := range want {
			if v != "" && have[k] != v {
				return false
			}
		}
		return true
	}))
}

// decodeBody reads a bounded, strictly decoded JSON body, answering 413 or 400 itself.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	err := configcenter.DecodeStrict(http.MaxBytesReader(w, r.Body, MaxBodyBytes), MaxBodyBytes, v)
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return true
	case errors.As(err, &tooLarge) || errors.Is(err, configcenter.ErrBodyTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes))
	default:
		writeError(w, http.StatusBadRequest, err.Error())
	}
	return false
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "method not allowed; use "+allow)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, configcenter.ErrorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
