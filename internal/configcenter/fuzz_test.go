package configcenter

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// countingReader counts what a decoder reads, to check that reads are bounded.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

const fuzzLimit = 1024

func FuzzDecodeValue(f *testing.F) {
	for _, s := range []string{
		`{"value":"v","revision":1}`,
		`{"value":"","revision":9223372036854775807}`,
		`{"value":"v"}`,
		`{"revision":1}`,
		`{"value":"v","revision":0}`,
		`{"value":"v","revision":-5}`,
		`{"value":"v","revision":1.5}`,
		`{"value":"v","revision":1,"extra":true}`,
		`{"value":"v","revision":1} trailing`,
		`{"value":"v","revision":1}{"value":"w","revision":2}`,
		`{"value":"\u0000\ud800","revision":3}`,
		`{"value":` + strings.Repeat("[", 500),
		`{"value":"` + strings.Repeat("x", 2*fuzzLimit) + `","revision":1}`,
		"\xff\xfe{}",
		`null`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cr := &countingReader{r: bytes.NewReader(data)}
		v, err := decodeValue(cr, fuzzLimit)
		if cr.n > fuzzLimit+1 {
			t.Fatalf("read %d bytes with a limit of %d", cr.n, fuzzLimit)
		}
		if int64(len(data)) > fuzzLimit && err == nil {
			t.Fatalf("accepted %d bytes with a limit of %d", len(data), fuzzLimit)
		}
		if err != nil {
			return
		}
		if v.Revision < 1 {
			t.Fatalf("accepted revision %d", v.Revision)
		}
		// What was accepted survives a round trip unchanged.
		enc, _ := json.Marshal(v)
		again, err := decodeValue(bytes.NewReader(enc), int64(len(enc)))
		if err != nil || again != v {
			t.Fatalf("round trip of %+v: %+v, %v", v, again, err)
		}
	})
}

func FuzzDecodeChangeSet(f *testing.F) {
	for _, s := range []string{
		`{"revision":3,"changes":[{"key":"a","revision":2,"deleted":false},{"key":"b","revision":3,"deleted":true}]}`,
		`{"revision":0,"changes":[]}`,
		`{"revision":0,"changes":[],"epoch":"abc"}`,
		`{"revision":0,"changes":[],"epoch":"` + strings.Repeat("e", 65) + `"}`,
		`{"revision":0}`,
		`{"changes":[]}`,
		`{"revision":1,"changes":[{"key":"A","revision":1}]}`,
		`{"revision":1,"changes":[{"key":"a","revision":2}]}`,
		`{"revision":1,"changes":[{"key":"../etc","revision":1}]}`,
		`{"revision":-1,"changes":[]}`,
		`{"revision":1,"changes":null}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cr := &countingReader{r: bytes.NewReader(data)}
		cs, err := decodeChangeSet(cr, fuzzLimit)
		if cr.n > fuzzLimit+1 {
			t.Fatalf("read %d bytes with a limit of %d", cr.n, fuzzLimit)
		}
		if err != nil {
			return
		}
		for _, c := range cs.Changes {
			if ValidateKey(c.Key) != nil || c.Revision < 1 || c.Revision > cs.Revision {
				t.Fatalf("accepted change %+v in a set at revision %d", c, cs.Revision)
			}
		}
	})
}

func FuzzParseKeyPath(f *testing.F) {
	for _, s := range []string{
		"/v1/domains/shop/keys/price",
		"/v1/domains/shop/keys/a.b_c-d",
		"/v1/domains/shop/keys/..",
		"/v1/domains/shop/keys/a..b",
		"/v1/domains/shop/keys/a%2Fb",
		"/v1/domains/shop/keys/a/b",
		"/v1/domains//keys/a",
		"/v1/domains/shop/keys/",
		"/v1/domains/Shop/keys/a",
		"/v1/domains/shop/keys/" + strings.Repeat("a", 64),
		"/v1/domains/-shop/keys/a",
		"/v1/domains/shop/keys/a\x00",
		"/v1/domains/shop/keys/é",
		"/v1/domains/shop/keys/a/keys/b",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		domain, key, err := ParseKeyPath(path)
		if err != nil {
			return
		}
		if ValidateDomain(domain) != nil || ValidateKey(key) != nil {
			t.Fatalf("ParseKeyPath(%q) accepted invalid names %q, %q", path, domain, key)
		}
		if strings.ContainsAny(domain+key, "/%\\") || strings.Contains(key, "..") {
			t.Fatalf("ParseKeyPath(%q) accepted unsafe names %q, %q", path, domain, key)
		}
		if KeyPath(domain, key) != path {
			t.Fatalf("ParseKeyPath(%q) = %q, %q, which do not rebuild the path", path, domain, key)
		}
	})
}
