package chart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wellFormed parses an SVG document to its end and counts its elements by
// name, failing the test on any XML error.
func wellFormed(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	counts := map[string]int{}
	var root string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
				if se.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root namespace %q, want the SVG namespace", se.Name.Space)
				}
			}
			counts[se.Name.Local]++
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return counts
}

func TestWriteWellFormed(t *testing.T) {
	c := &Chart{
		Title:  `latency <p99> & "p50"`,
		XLabel: "seconds since start",
		YLabel: "seconds",
		Series: []Series{
			{Name: "p50", Points: []Point{{0, 0.1}, {5, 0.2}, {10, 0.15}}},
			{Name: "p99 <slow>", Points: []Point{{0, 0.5}, {5, 2.5}, {10, 0.9}}},
			{Name: "kshard-0 shards", Step: true, Points: []Point{{0, 64}, {4, 32}, {10, 21}}},
			{Name: "empty"},
			{Name: "single", Points: []Point{{3, 1}}},
		},
		Markers: []Marker{{X: 4, Label: "kill kshard-1 & restart"}},
	}
	var buf bytes.Buffer
	if err := c.Write(&buf); err != nil {
		t.Fatal(err)
	}
	counts := wellFormed(t, buf.Bytes())
	// One path per non-empty series.
	if counts["path"] != 4 {
		t.Errorf("%d paths, want 4 (one per non-empty series)", counts["path"])
	}
	if counts["circle"] != 1 {
		t.Errorf("%d circles, want 1 for the single-point series", counts["circle"])
	}
	out := buf.String()
	for _, want := range []string{"latency &lt;p99&gt; &amp; &#34;p50&#34;", "kill kshard-1 &amp; restart", "p99 &lt;slow&gt;"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks escaped text %q", want)
		}
	}
	if !strings.Contains(out, " H") || !strings.Contains(out, " V") {
		t.Error("the step series is not drawn with H/V segments")
	}
}

// TestWriteEmptyChart: a chart without a point (no latency recorded, no
// replica scraped) is drawn, and says "no data" rather than showing an
// empty plot that reads as a flat line; one with a point does not.
func TestWriteEmptyChart(t *testing.T) {
	for _, c := range []*Chart{
		{Title: "nothing yet"},
		{Title: "empty series", Series: []Series{{Name: "p99"}, {Name: "max"}}, Markers: []Marker{{X: 3, Label: "kill kshard-1"}}},
	} {
		var buf bytes.Buffer
		if err := c.Write(&buf); err != nil {
			t.Fatal(err)
		}
		wellFormed(t, buf.Bytes())
		if !strings.Contains(buf.String(), ">no data</text>") {
			t.Errorf("%s: no \"no data\" in\n%s", c.Title, buf.String())
		}
	}
	var buf bytes.Buffer
	if err := (&Chart{Title: "one point", Series: []Series{{Name: "p99", Points: []Point{{1, 0}}}}}).Write(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "no data") {
		t.Error("a chart with a point says no data")
	}
}

func TestWriteRejectsNonFinite(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1)} {
		c := &Chart{Title: "bad", Series: []Series{{Name: "s", Points: []Point{{0, 1}, {1, v}}}}}
		if err := c.Write(io.Discard); err == nil || !strings.Contains(err.Error(), `series "s"`) {
			t.Errorf("value %v: error %v, want one naming the series", v, err)
		}
	}
}

func TestTicksAreRoundAndCover(t *testing.T) {
	for _, tc := range []struct{ lo, hi float64 }{{0, 1}, {0, 97}, {0.003, 0.04}, {-5, 12}, {0, 12345}} {
		ts := ticks(tc.lo, tc.hi, 6)
		if ts[0] > tc.lo || ts[len(ts)-1] < tc.hi {
			t.Errorf("ticks(%v, %v) = %v do not cover the range", tc.lo, tc.hi, ts)
		}
		if len(ts) < 3 || len(ts) > 14 {
			t.Errorf("ticks(%v, %v) = %v: %d ticks", tc.lo, tc.hi, ts, len(ts))
		}
		step := ts[1] - ts[0]
		mant := step / math.Pow(10, math.Floor(math.Log10(step)))
		if r := math.Round(mant*1e9) / 1e9; r != 1 && r != 2 && r != 5 {
			t.Errorf("ticks(%v, %v): step %v is not 1, 2 or 5 times a power of ten", tc.lo, tc.hi, step)
		}
	}
}

func TestLabel(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.1 + 0.2: "0.3", 2: "2", 1500: "1500", 25000: "25k", 3e6: "3M"} {
		if got := label(v); got != want {
			t.Errorf("label(%v) = %q, want %q", v, got, want)
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/*.svg from the current code")

// TestWriteGolden draws fixed charts (series of every kind, markers, no
// points at all) and compares them with testdata, drawn by the code before
// Write was split into steps: the SVG must stay the same to the byte.
func TestWriteGolden(t *testing.T) {
	for name, c := range map[string]*Chart{
		"series": {
			Title: "latency <p99>", XLabel: "seconds since start", YLabel: "seconds",
			Series: []Series{
				{Name: "p50", Points: []Point{{0, 0.1}, {5, 0.2}, {10, 0.15}}},
				{Name: "p99", Points: []Point{{0, 0.5}, {5, 2.5}, {10, 0.9}}},
				{Name: "kshard-0 shards", Step: true, Points: []Point{{0, 64}, {4, 32}, {10, 21}}},
				{Name: "empty"},
				{Name: "single", Points: []Point{{3, 1}}},
			},
			Markers: []Marker{{X: 4, Label: "kill kshard-1"}, {X: 7.5, Label: "restart"}},
		},
		"empty": {Title: "nothing yet", Series: []Series{{Name: "p99"}}, Markers: []Marker{{X: 3, Label: "kill kshard-1"}}},
	} {
		var buf bytes.Buffer
		if err := c.Write(&buf); err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", name+".svg")
		if *update {
			if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s: drawn\n%s\nwant\n%s", name, buf.Bytes(), want)
		}
	}
}
