package standin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kshard/kshard/internal/configcenter"
)

// FuzzServer sends arbitrary requests to the server's handler: it must never panic, and every
// failure must be a JSON error.
func FuzzServer(f *testing.F) {
	for _, s := range [][3]string{
		{"GET", "/v1/domains/domain-0/keys/key-0", ""},
		{"PUT", "/v1/domains/domain-0/keys/key-0", `{"value":"x"}`},
		{"PUT", "/v1/domains/domain-0/keys/key-0", `{"value":`},
		{"DELETE", "/v1/domains/domain-0/keys/key-0", ""},
		{"GET", "/v1/domains/domain-0/changes?since=0&timeout=0s", ""},
		{"GET", "/v1/domains/domain-0/changes?since=99999&timeout=0", ""},
		{"POST", "/admin/seed", `{"domains":1,"keysPerDomain":1,"valueBytes":1}`},
		{"PUT", "/admin/faults", `{"latency":"0s"}`},
		{"GET", "/v1/domains/../keys/x", ""},
		{"GET", "/%zz", ""},
	} {
		f.Add(s[0], s[1], []byte(s[2]))
	}
	srv := &Server{store: newStore()}
	srv.opts.setDefaults()
	srv.opts.MaxPollTimeout = 0 // polls never wait in this fuzz test
	srv.opts.DefaultPollTimeout = 0
	srv.log = srv.opts.Log
	srv.rec = newRecorder(16, srv.store, &srv.waiting)
	srv.store.seed(configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1, ValueBytes: 4})
	h := srv.handler()
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		if !strings.HasPrefix(target, "/") {
			return
		}
		req, err := http.NewRequest(method, "http://x"+target, bytes.NewReader(body))
		if err != nil {
			return
		}
		// Faults other than none would make the fuzz test slow; seeding is bounded by Validate.
		if strings.Contains(req.URL.Path, "/admin/faults") || strings.Contains(req.URL.Path, "/admin/seed") && len(body) > 200 {
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 400 {
			var e configcenter.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %s answered %d with %q, not a JSON error", method, target, rec.Code, rec.Body.Bytes())
			}
		}
	})
}
