package configcenter

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestClientRejectsBadBaseURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "http://h/path", "http://h?q=1", "::"} {
		if _, err := NewClient(ClientOptions{BaseURL: u}); err == nil {
			t.Errorf("NewClient(%q) succeeded", u)
		}
	}
	// A token goes over plain http only to this machine.
	for _, u := range []string{"http://configcenter.example:8080", "http://10.0.0.1"} {
		if _, err := NewClient(ClientOptions{BaseURL: u, Token: "secret"}); err == nil || !strings.Contains(err.Error(), "https") {
			t.Errorf("NewClient(%q) with a token: %v, want a refusal", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8080", "http://localhost", "http://[::1]:1", "https://configcenter.example"} {
		if _, err := NewClient(ClientOptions{BaseURL: u, Token: "secret"}); err != nil {
			t.Errorf("NewClient(%q) with a token: %v", u, err)
		}
	}
	c, err := NewClient(ClientOptions{BaseURL: "http://127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), "Bad", "k"); err == nil || !strings.Contains(err.Error(), "DNS-1123") {
		t.Errorf("Get with a bad domain: %v, want a validation error before any request", err)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                              0,
		"2":                             2 * time.Second,
		"-1":                            0,
		"soon":                          0,
		"Thu, 01 Jan 2026 00:00:05 GMT": 5 * time.Second,
		"Wed, 31 Dec 2025 23:59:00 GMT": 0,
	}
	for in, want := range cases {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestStatusErrorCarriesTheServerMessage(t *testing.T) {
	e := &StatusError{Code: 429, RetryAfter: 2 * time.Second, Message: "slow down"}
	if e.StatusCode() != 429 || e.RetryAfterHint() != 2*time.Second ||
		!strings.Contains(e.Error(), "429") || !strings.Contains(e.Error(), "slow down") {
		t.Errorf("StatusError = %q", e.Error())
	}
	if got, _ := errorMessage(strings.NewReader("<html>" + strings.Repeat("x", 10000))); len(got) > 210 {
		t.Errorf("errorMessage of a large non-JSON body is %d bytes long", len(got))
	}
}

func TestDurationJSON(t *testing.T) {
	var f Faults
	if err := json.Unmarshal([]byte(`{"latency":"1.5s","jitter":"10ms"}`), &f); err != nil {
		t.Fatal(err)
	}
	if f.Latency.Duration != 1500*time.Millisecond || f.Jitter.Duration != 10*time.Millisecond {
		t.Errorf("decoded %+v", f)
	}
	out, _ := json.Marshal(f)
	if !strings.Contains(string(out), `"latency":"1.5s"`) {
		t.Errorf("encoded %s", out)
	}
}
