package doccheck

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// checkedDocs are the Markdown files held to the code: the README, docs/,
// externalcache's and deploy/'s READMEs, and the load tester's two.
func checkedDocs(t *testing.T, s *sources) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(s.root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "externalcache/README.md", "deploy/README.md", "loadtest/k6/README.md", "loadtest/README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(s.root, d)
		out = append(out, filepath.ToSlash(rel))
	}
	slices.Sort(out)
	return out
}

// snippet is one piece of code a document cites: an inline code span, or
// a command of a fenced code block (its continuation lines joined).
type snippet struct {
	doc     string
	line    int
	text    string
	code    bool   // from a fenced code block
	heading string // the heading of its section, without the #s
}

func (sn snippet) String() string { return fmt.Sprintf("%s:%d: `%s`", sn.doc, sn.line, sn.text) }

// document is one Markdown file, read once per test.
type document struct {
	path     string
	lines    []string
	snippets []snippet
}

// spans are inline code: a run of backticks up to the same run, within a
// paragraph (a span may wrap onto the next line of its paragraph).
var spans = regexp.MustCompile("``(?:[^`]|`[^`])+?``|`[^`]+`")

func readDocument(s *sources, rel string) (*document, error) {
	lines, err := s.readLines(rel)
	if err != nil {
		return nil, err
	}
	d := &document{path: rel, lines: lines}
	// Fenced code blocks: each line is a snippet, a line ending in a
	// backslash joined with the next (a command wrapped for reading).
	prose := make([]string, len(lines))
	fence := ""
	var cont *snippet
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if fence == "" {
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				continue
			}
			prose[i] = l
			continue
		}
		if strings.HasPrefix(trimmed, fence) {
			fence = ""
			continue
		}
		text, more := strings.CutSuffix(trimmed, `\`)
		if cont != nil {
			cont.text += " " + strings.TrimSpace(text)
		} else {
			d.snippets = append(d.snippets, snippet{doc: rel, line: i + 1, text: strings.TrimSpace(text), code: true})
			cont = &d.snippets[len(d.snippets)-1]
		}
		if !more {
			cont = nil
		}
	}
	// Inline spans in the prose, paragraph by paragraph.
	start := 0
	for i := 0; i <= len(prose); i++ {
		if i < len(prose) && strings.TrimSpace(prose[i]) != "" {
			continue
		}
		para := strings.Join(prose[start:i], "\n")
		for _, loc := range spans.FindAllStringIndex(para, -1) {
			text := strings.Trim(para[loc[0]:loc[1]], "`")
			text = strings.Join(strings.Fields(text), " ")
			line := start + 1 + strings.Count(para[:loc[0]], "\n")
			d.snippets = append(d.snippets, snippet{doc: rel, line: line, text: text})
		}
		start = i + 1
	}
	slices.SortStableFunc(d.snippets, func(a, b snippet) int { return a.line - b.line })
	heading, next := "", 0
	for i := range d.snippets {
		for ; next < d.snippets[i].line; next++ {
			if h, ok := strings.CutPrefix(prose[next], "#"); ok {
				heading = strings.TrimSpace(strings.TrimLeft(h, "#"))
			}
		}
		d.snippets[i].heading = heading
	}
	return d, nil
}

// documents reads every checked document.
func documents(t *testing.T, s *sources) []*document {
	t.Helper()
	var out []*document
	for _, rel := range checkedDocs(t, s) {
		d, err := readDocument(s, rel)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// findings collects what a test found wrong, and reports it sorted, one
// line each, so that a failure lists every stale citation at once.
type findings []string

func (f *findings) add(format string, args ...any) { *f = append(*f, fmt.Sprintf(format, args...)) }

func (f findings) report(t *testing.T, what string) {
	t.Helper()
	if len(f) == 0 {
		return
	}
	slices.Sort(f)
	f = slices.Compact(f)
	t.Errorf("%d %s:\n  %s", len(f), what, strings.Join(f, "\n  "))
}
