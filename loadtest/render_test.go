package loadtest

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the expected renderings in testdata/render from the current code")

// TestRenderCommittedReports renders every committed report's JSON
// (results/**/*.json) and compares the Markdown with testdata/render, made
// by the code before the report's rendering was restructured: a table of
// rows must render the rows the hand-written code did, to the byte.
func TestRenderCommittedReports(t *testing.T) {
	files, err := filepath.Glob("results/*.json")
	if err != nil {
		t.Fatal(err)
	}
	nested, err := filepath.Glob("results/*/*.json")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, nested...)
	if len(files) < 10 {
		t.Fatalf("%d committed reports, want the results folder's", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rep Report
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got := renderMarkdown(&rep)
		name := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(f, "results/"), ".json"), "/", "-")
		golden := filepath.Join("testdata", "render", name+".md")
		if *update {
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
			for i := range min(len(gl), len(wl)) {
				if gl[i] != wl[i] {
					t.Errorf("%s: line %d is\n%s\nwant\n%s", f, i+1, gl[i], wl[i])
					break
				}
			}
			if len(gl) != len(wl) {
				t.Errorf("%s: %d lines, want %d", f, len(gl), len(wl))
			}
		}
	}
}
