package configcenter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is returned by Client.Get and Client.Delete when the config center itself says
// the domain or key does not exist.
var ErrNotFound = errors.New("not found")

// ErrInvalidAnswer is wrapped by errors of a 2xx answer that cannot be read as what was asked
// for: the fault of that answer (that key), not of the connection or the service as a whole.
var ErrInvalidAnswer = errors.New("invalid answer")

// StatusError is an answer other than success or not-found. Callers use Code to tell
// throttling (429) and server failures (5xx), which are worth retrying, from their own mistakes
// (other 4xx), which are not, and RetryAfter to know when the server allows the next call.
type StatusError struct {
	// Code is the HTTP status code.
	Code int
	// RetryAfter is the server's Retry-After, zero when it named none.
	RetryAfter time.Duration
	// Message is the server's error message, if it sent one.
	Message string
}

// Error says what the server answered, with its message and Retry-After.
func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "config center answered %d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// StatusCode is the HTTP status code; externalcache uses it to classify the failure.
func (e *StatusError) StatusCode() int { return e.Code }

// RetryAfterHint is the time the server asked the caller to wait; externalcache honours it.
func (e *StatusError) RetryAfterHint() time.Duration { return e.RetryAfter }

// ClientOptions configures a Client.
type ClientOptions struct {
	// BaseURL is the server's URL, for example http://configcenter:8080. Required.
	BaseURL string
	// Token is sent as a bearer token when set.
	Token string
	// Caller is sent as X-Kshard-Caller so that the server can count calls per caller.
	Caller string
	// HTTPClient sends the requests. Default: a client whose transport keeps up to 64 idle
	// connections to the server, so that concurrent fetch workers reuse connections.
	HTTPClient *http.Client
	// RequestTimeout bounds every request except change-feed polls. Default 10s.
	RequestTimeout time.Duration
	// PollTimeout is how long a change-feed poll asks the server to wait; the request itself may
	// take PollTimeout+RequestTimeout. Default 25s.
	PollTimeout time.Duration
	// MaxResponseBytes bounds every response body read. Default 4 MiB.
	MaxResponseBytes int64
}

func (o *ClientOptions) setDefaults() {
	if o.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 128
		t.MaxIdleConnsPerHost = 64
		o.HTTPClient = &http.Client{Transport: t}
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.PollTimeout <= 0 {
		o.PollTimeout = 25 * time.Second
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 4 << 20
	}
}

// Client talks to a config center. It is safe for concurrent use.
type Client struct {
	opts ClientOptions
	base *url.URL
}

// NewClient validates the options and returns a Client.
func NewClient(opts ClientOptions) (*Client, error) {
	opts.setDefaults()
	u, err := url.Parse(strings.TrimSuffix(opts.BaseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("parsing config center URL %q: %w", opts.BaseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("config center URL %q must be http(s)://host[:port] without path or query", opts.BaseURL)
	}
	if opts.Token != "" && u.Scheme == "http" && !loopback(u.Hostname()) {
		return nil, fmt.Errorf("refusing to send the config center token over plain http to %s: anyone on the path could read it; use https://", u.Host)
	}
	u.Path = ""
	return &Client{opts: opts, base: u}, nil
}

// loopback reports whether a URL's host is this machine, where plain http
// exposes a token to no one else.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Get reads a key. It returns an error wrapping ErrNotFound when the domain or key does not
// exist, a *StatusError for any other answer than success, or the transport error.
func (c *Client) Get(ctx context.Context, domain, key string) (Value, error) {
	if err := validateRef(domain, key); err != nil {
		return Value{}, fmt.Errorf("getting %s/%s: %w", domain, key, err)
	}
	var v Value
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodGet, KeyPath(domain, key), nil, nil, true,
		func(r io.Reader) (err error) { v, err = decodeValue(r, c.opts.MaxResponseBytes); return err })
	if err != nil {
		return Value{}, fmt.Errorf("getting %s/%s: %w", domain, key, err)
	}
	return v, nil
}

// Put creates or updates a key and returns it with its new revision.
func (c *Client) Put(ctx context.Context, domain, key, value string) (Value, error) {
	if err := validateRef(domain, key); err != nil {
		return Value{}, fmt.Errorf("putting %s/%s: %w", domain, key, err)
	}
	var v Value
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodPut, KeyPath(domain, key), nil, PutBody{Value: &value}, false,
		func(r io.Reader) (err error) { v, err = decodeValue(r, c.opts.MaxResponseBytes); return err })
	if err != nil {
		return Value{}, fmt.Errorf("putting %s/%s: %w", domain, key, err)
	}
	return v, nil
}

// Delete removes a key and returns the revision of the deletion.
func (c *Client) Delete(ctx context.Context, domain, key string) (int64, error) {
	if err := validateRef(domain, key); err != nil {
		return 0, fmt.Errorf("deleting %s/%s: %w", domain, key, err)
	}
	var out struct {
		Revision int64 `json:"revision"`
	}
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodDelete, KeyPath(domain, key), nil, nil, true,
		func(r io.Reader) error { return DecodeStrict(r, c.opts.MaxResponseBytes, &out) })
	if err != nil {
		return 0, fmt.Errorf("deleting %s/%s: %w", domain, key, err)
	}
	return out.Revision, nil
}

// Changes polls the change feed of a domain: it returns at once when keys changed after since,
// and otherwise when the server's wait (PollTimeout) ends, with no changes and the current
// revision.
func (c *Client) Changes(ctx context.Context, domain string, since int64) (ChangeSet, error) {
	if err := ValidateDomain(domain); err != nil {
		return ChangeSet{}, fmt.Errorf("polling changes of %s: %w", domain, err)
	}
	if since < 0 {
		return ChangeSet{}, fmt.Errorf("polling changes of %s: since %d is negative", domain, since)
	}
	q := url.Values{"since": {strconv.FormatInt(since, 10)}, "timeout": {c.opts.PollTimeout.String()}}
	var cs ChangeSet
	err := c.do(ctx, c.opts.PollTimeout+c.opts.RequestTimeout, http.MethodGet, "/v1/domains/"+domain+"/changes", q, nil, false,
		func(r io.Reader) (err error) { cs, err = decodeChangeSet(r, c.opts.MaxResponseBytes); return err })
	if err != nil {
		return ChangeSet{}, fmt.Errorf("polling changes of %s since %d: %w", domain, since, err)
	}
	return cs, nil
}

// Faults reads the injected faults.
func (c *Client) Faults(ctx context.Context) (Faults, error) {
	var f Faults
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodGet, "/admin/faults", nil, nil, false,
		func(r io.Reader) error { return DecodeStrict(r, c.opts.MaxResponseBytes, &f) })
	if err != nil {
		return Faults{}, fmt.Errorf("reading faults: %w", err)
	}
	return f, nil
}

// SetFaults replaces the injected faults.
func (c *Client) SetFaults(ctx context.Context, f Faults) error {
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodPut, "/admin/faults", nil, f, false,
		func(r io.Reader) error { return DecodeStrict(r, c.opts.MaxResponseBytes, &Faults{}) })
	if err != nil {
		return fmt.Errorf("setting faults: %w", err)
	}
	return nil
}

// Seed fills the server with synthetic data.
func (c *Client) Seed(ctx context.Context, o SeedOptions) (SeedResult, error) {
	var res SeedResult
	err := c.do(ctx, max(c.opts.RequestTimeout, 5*time.Minute), http.MethodPost, "/admin/seed", nil, o, false,
		func(r io.Reader) error { return DecodeStrict(r, c.opts.MaxResponseBytes, &res) })
	if err != nil {
		return SeedResult{}, fmt.Errorf("seeding: %w", err)
	}
	return res, nil
}

// Stats reads the server's request counts.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodGet, "/admin/stats", nil, nil, false,
		func(r io.Reader) error { return DecodeStrict(r, c.opts.MaxResponseBytes, &s) })
	if err != nil {
		return Stats{}, fmt.Errorf("reading stats: %w", err)
	}
	return s, nil
}

// ResetStats clears the server's request counts.
func (c *Client) ResetStats(ctx context.Context) error {
	err := c.do(ctx, c.opts.RequestTimeout, http.MethodPost, "/admin/stats/reset", nil, nil, false,
		func(r io.Reader) error { _, err := readBounded(r, c.opts.MaxResponseBytes); return err })
	if err != nil {
		return fmt.Errorf("resetting stats: %w", err)
	}
	return nil
}

func validateRef(domain, key string) error {
	if err := ValidateDomain(domain); err != nil {
		return err
	}
	return ValidateKey(key)
}

// do sends one request and decodes a 2xx answer with decode. A 404 becomes ErrNotFound when
// notFound is set; any other non-2xx answer becomes a *StatusError.
func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, query url.Values, body any,
	notFound bool, decode func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := *c.base
	u.Path = path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding request: %w", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.opts.Caller != "" {
		req.Header.Set(CallerHeader, c.opts.Caller)
	}
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		// Drain a little so that the connection can be reused, but never read without bound.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Read first, so that a broken connection (retry) is told from an
		// answer that arrived and is wrong (this key's fault).
		data, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxResponseBytes+1))
		if err != nil {
			return fmt.Errorf("reading answer: %w", err)
		}
		if err := decode(bytes.NewReader(data)); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidAnswer, err)
		}
		return nil
	}
	msg, reason := errorMessage(resp.Body)
	if resp.StatusCode == http.StatusNotFound && notFound && reason == ReasonNotFound {
		return fmt.Errorf("%w: %s", ErrNotFound, msg)
	}
	return &StatusError{
		Code:       resp.StatusCode,
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
		Message:    msg,
	}
}

// errorMessage extracts the server's message from an error body, bounded, tolerating bodies
// that are not the expected JSON (a proxy's HTML page, for example).
func errorMessage(r io.Reader) (msg, reason string) {
	data, _ := io.ReadAll(io.LimitReader(r, 4<<10))
	var b ErrorBody
	if json.Unmarshal(data, &b) == nil && b.Error != "" {
		return b.Error, b.Reason
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(data), "?"))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s, ""
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
