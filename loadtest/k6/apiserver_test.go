package k6_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kshard/kshard/internal/controlplane"
)

// cp is the real control plane the request bodies are checked against:
// etcd and kube-apiserver with deploy/crd, nil with -short.
var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

// dryRun makes a create or patch a dry run, and has the server reject a
// field it does not know, which by default (what k6 gets) it would drop
// with only a warning header: a misspelt field fails here.
const dryRun = "?dryRun=All&fieldValidation=Strict"

// attempts numbers the runs of TestRequestBodiesAreValidOnTheAPIServer in
// this process: -count reruns it against the same control plane, so each
// run makes its namespace and binding under fresh names.
var attempts int

// expect sends body (none when nil) the way the scripts do through
// `kubectl proxy`, fails the test unless the status is want, and returns the
// decoded answer: the object, or the Status that says what was refused.
func expect(t *testing.T, c *http.Client, want int, method, url, contentType string, body []byte) map[string]any {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	var out map[string]any
	if json.Unmarshal(raw, &out) != nil {
		out = map[string]any{"message": string(raw)} // "404 page not found": nothing serves the path
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: HTTP %d, want %d: %v\nbody: %s", method, url, resp.StatusCode, want, out["message"], body)
	}
	return out
}

// generation is a decoded object's metadata.generation, 0 if it has none.
func generation(obj map[string]any) float64 {
	meta, _ := obj["metadata"].(map[string]any)
	g, _ := meta["generation"].(float64)
	return g
}

// TestRequestBodiesAreValidOnTheAPIServer builds the bodies the scripts
// send with their own functions and sends them, to the URLs the scripts
// build, to a real kube-apiserver with deploy/crd: setupRun's namespace,
// ConfigBinding creates and key updates (dry runs; the updates on a binding
// that exists), and chaos.js's DeleteOptions. Bodies the schema refuses are
// planted too, to show that the check can fail.
func TestRequestBodiesAreValidOnTheAPIServer(t *testing.T) {
	controlplane.Require(t, cp)
	c, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	attempts++
	suffix := fmt.Sprintf("-%03d", attempts)
	// The default sizes, and the largest settings loadSettings accepts: the
	// longest names and the most keys. The pods chaos.js deletes are looked
	// for in the bindings' namespace here, which the test makes anyway.
	for _, v := range []struct {
		name string
		env  map[string]string
	}{
		{"defaults", map[string]string{"NAMESPACE": "kshard-loadtest" + suffix, "KSHARD_NAMESPACE": "kshard-loadtest" + suffix, "CHAOS_GRACE_SECONDS": "0"}},
		{"largest", map[string]string{"NAMESPACE": strings.Repeat("n", 36) + suffix, "RUN_ID": strings.Repeat("r", 36) + suffix,
			"OBJECTS": "100000", "DOMAINS": "100000", "KEYS_PER_DOMAIN": "100000", "KEYS": "64"}},
	} {
		t.Run(v.name, func(t *testing.T) {
			v.env["K8S_API"] = cp.Config.Host
			lib := mustEvaluate(t, "lib/configbinding.js", v.env)
			s := lib.call(t, "loadSettings")
			settings, _ := s.Export().(map[string]any)
			objects, _ := settings["objects"].(int64)
			keysPerDomain, _ := settings["keysPerDomain"].(int64)
			runID, _ := settings["runId"].(string)
			runID = cmp.Or(runID, fmt.Sprintf("mc%06d", attempts)) // the shape of setupRun's Date.now().toString(36)

			// For real, not a dry run: the bindings need their namespace.
			expect(t, c, http.StatusCreated, "POST", fmt.Sprint(settings["api"], "/api/v1/namespaces?fieldValidation=Strict"),
				"application/json", lib.body(t, "namespaceObject", s))
			// The first binding, one whose keys wrap round to key-0, the last.
			collection := lib.call(t, "collectionPath", s).String()
			for _, i := range []int64{0, keysPerDomain - 1, objects - 1} {
				expect(t, c, http.StatusCreated, "POST", collection+dryRun, "application/json", lib.body(t, "binding", s, runID, i))
			}
			// The updates patch a binding that exists, and each must change
			// its spec: the run then waits for the generation it answers.
			created := expect(t, c, http.StatusCreated, "POST", collection+"?fieldValidation=Strict", "application/json",
				lib.body(t, "binding", s, runID, 0))
			object := lib.call(t, "objectPath", s, lib.call(t, "bindingName", runID, 0)).String()
			for _, round := range []int64{1, keysPerDomain - 1} {
				patched := expect(t, c, http.StatusOK, "PATCH", object+dryRun, "application/merge-patch+json",
					lib.body(t, "keysPatch", s, 0, round))
				if g, g0 := generation(patched), generation(created); g0 < 1 || g != g0+1 {
					t.Errorf("update round %d: generation %v after %v: the patch does not change the spec", round, g, g0)
				}
			}
			if v.name != "defaults" {
				return
			}

			// CHAOS_GRACE_SECONDS=0 must delete a pod at once, as a crash,
			// though a node runs it.
			pods := fmt.Sprint(settings["api"], "/api/v1/namespaces/", settings["controllerNamespace"], "/pods")
			pod := fmt.Sprint(settings["statefulSet"], "-0")
			expect(t, c, http.StatusCreated, "POST", pods, "application/json",
				[]byte(`{"metadata":{"name":"`+pod+`"},"spec":{"nodeName":"node-0","containers":[{"name":"kshard","image":"kshard:dev"}]}}`))
			expect(t, c, http.StatusOK, "DELETE", pods+"/"+pod, "application/json", lib.body(t, "podDeleteOptions", s))
			expect(t, c, http.StatusNotFound, "GET", pods+"/"+pod, "", nil)

			// Planted: the script's binding with a key twice in its set of
			// keys, and a patch of the immutable domain.
			dup := bytes.Replace(lib.body(t, "binding", s, runID, 1), []byte(`"keys":["key-1",`), []byte(`"keys":["key-1","key-1",`), 1)
			for _, p := range []struct{ method, url, contentType, body, want string }{
				{"POST", collection + dryRun, "application/json", string(dup), "Duplicate value"},
				{"PATCH", object + dryRun, "application/merge-patch+json", `{"spec":{"domain":"domain-1"}}`, "domain is immutable"},
			} {
				out := expect(t, c, http.StatusUnprocessableEntity, p.method, p.url, p.contentType, []byte(p.body))
				if msg := fmt.Sprint(out["message"]); !strings.Contains(msg, p.want) {
					t.Errorf("planted %s %s: refused with %q, want %q", p.method, p.body, msg, p.want)
				} else {
					t.Logf("planted %s %s refused: %s", p.method, p.body, msg)
				}
			}
		})
	}
}
