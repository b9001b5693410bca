// Package chart draws line charts as standalone SVG files, for the load
// tester's reports.
//
// Reports are Markdown files committed next to their charts, read on GitHub
// or in an editor: an SVG renders in both, diffs as text and needs no
// plotting library, browser or network at run time. The package draws what
// the reports need and nothing more: numeric X and Y axes with round tick
// values, one polyline (or step line) per series, a legend, labelled
// vertical markers for events such as "kill kshard-1", and "no data" across
// a chart without a point.
package chart

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one sample of a series.
type Point struct {
	X, Y float64
}

// Series is one line of a chart.
type Series struct {
	Name   string
	Points []Point
	// Step draws the series as a step function (the value holds until the
	// next point), for counts such as shards owned that change at instants.
	Step bool
}

// Marker is a labelled vertical line at an X value: an event of the run.
type Marker struct {
	X     float64
	Label string
}

// Chart is a line chart. The zero value of every optional field is a usable
// default.
type Chart struct {
	Title  string
	XLabel string
	YLabel string
	Series []Series
	// Markers are drawn as dashed vertical lines with their label on top.
	Markers []Marker
	// YMin fixes the bottom of the Y axis; by default it is 0, or the
	// smallest value when some are negative.
	YMin *float64
	// Width and Height are the SVG size in pixels. Defaults 900 × 360.
	Width, Height int
}

// palette is distinguishable in colour and in greyscale print.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

// Layout, in pixels.
const (
	marginLeft   = 70
	marginRight  = 170 // the legend sits here
	marginTop    = 40
	marginBottom = 50
	fontFamily   = "sans-serif"
)

// Write renders the chart as a complete SVG document. It rejects NaN and
// infinite values, which would silently produce an unreadable drawing.
func (c *Chart) Write(w io.Writer) error {
	if err := c.validate(); err != nil {
		return err
	}
	cv, err := c.layout(w)
	if err != nil {
		return err
	}
	cv.p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	cv.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="12">`+"\n",
		cv.width, cv.height, cv.width, cv.height, fontFamily)
	cv.p(`<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", cv.width, cv.height)
	cv.p(`<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginLeft, esc(c.Title))
	cv.axes(c.XLabel, c.YLabel)
	cv.markers(c.Markers) // below the lines
	cv.series(c.Series)
	// A chart with nothing to draw says so: an empty plot, or a lone zero
	// axis, would read as a measured flat line.
	if !c.hasPoints() {
		cv.p(`<text x="%s" y="%s" text-anchor="middle" font-size="15" fill="#555">no data</text>`+"\n", f(marginLeft+cv.plotW/2), f(marginTop+cv.plotH/2))
	}
	cv.legend(c.Series)
	cv.p("</svg>\n")
	return cv.b.Flush()
}

// canvas is a chart being drawn: the SVG's size, the plot's, the data
// range it spans and the round ticks on its axes.
type canvas struct {
	b                      *bufio.Writer
	width, height          int
	plotW, plotH           float64
	xmin, xmax, ymin, ymax float64
	xt, yt                 []float64
}

// layout sizes the chart and fits its axes to the data, widened to round
// ticks.
func (c *Chart) layout(w io.Writer) (*canvas, error) {
	cv := &canvas{b: bufio.NewWriter(w), width: c.Width, height: c.Height}
	if cv.width == 0 {
		cv.width = 900
	}
	if cv.height == 0 {
		cv.height = 360
	}
	cv.plotW = float64(cv.width - marginLeft - marginRight)
	cv.plotH = float64(cv.height - marginTop - marginBottom)
	if cv.plotW <= 0 || cv.plotH <= 0 {
		return nil, fmt.Errorf("chart %q: %d×%d pixels leaves no room for the plot", c.Title, cv.width, cv.height)
	}
	xmin, xmax, ymin, ymax := c.bounds()
	cv.xt, cv.yt = ticks(xmin, xmax, 8), ticks(ymin, ymax, 6)
	cv.xmin, cv.xmax = math.Min(xmin, cv.xt[0]), math.Max(xmax, cv.xt[len(cv.xt)-1])
	cv.ymin, cv.ymax = math.Min(ymin, cv.yt[0]), math.Max(ymax, cv.yt[len(cv.yt)-1])
	return cv, nil
}

func (cv *canvas) p(format string, args ...any) { fmt.Fprintf(cv.b, format, args...) }

// px and py are a data point's pixel coordinates.
func (cv *canvas) px(x float64) float64 {
	return marginLeft + (x-cv.xmin)/(cv.xmax-cv.xmin)*cv.plotW
}

func (cv *canvas) py(y float64) float64 {
	return marginTop + cv.plotH - (y-cv.ymin)/(cv.ymax-cv.ymin)*cv.plotH
}

// axes draws the grid, the tick labels, the plot's frame and the axis
// labels.
func (cv *canvas) axes(xLabel, yLabel string) {
	for _, v := range cv.yt {
		y := cv.py(v)
		cv.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(marginLeft), f(y), f(marginLeft+cv.plotW), f(y))
		cv.p(`<text x="%s" y="%s" text-anchor="end" dy="4">%s</text>`+"\n", f(marginLeft-6), f(y), esc(label(v)))
	}
	for _, v := range cv.xt {
		x := cv.px(v)
		cv.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(x), f(marginTop), f(x), f(marginTop+cv.plotH))
		cv.p(`<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(x), f(marginTop+cv.plotH+16), esc(label(v)))
	}
	cv.p(`<rect x="%d" y="%d" width="%s" height="%s" fill="none" stroke="#444"/>`+"\n", marginLeft, marginTop, f(cv.plotW), f(cv.plotH))
	cv.p(`<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", f(marginLeft+cv.plotW/2), cv.height-10, esc(xLabel))
	cv.p(`<text x="16" y="%s" text-anchor="middle" transform="rotate(-90 16 %s)">%s</text>`+"\n", f(marginTop+cv.plotH/2), f(marginTop+cv.plotH/2), esc(yLabel))
}

// markers draws each marker as a dashed vertical line with its label.
func (cv *canvas) markers(ms []Marker) {
	for i, m := range ms {
		x := cv.px(m.X)
		cv.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#888" stroke-dasharray="4 3"/>`+"\n", f(x), f(marginTop), f(x), f(marginTop+cv.plotH))
		// Stagger label heights so neighbouring markers stay readable.
		ly := marginTop + 12 + float64(i%4)*12
		cv.p(`<text x="%s" y="%s" font-size="10" fill="#555">%s</text>`+"\n", f(x+3), f(ly), esc(m.Label))
	}
}

// series draws each series with points as a path (steps for a step
// series), a lone point as a dot too.
func (cv *canvas) series(ss []Series) {
	for i, s := range ss {
		color := palette[i%len(palette)]
		if len(s.Points) == 0 {
			continue
		}
		var d strings.Builder
		for j, pt := range s.Points {
			x, y := cv.px(pt.X), cv.py(pt.Y)
			switch {
			case j == 0:
				fmt.Fprintf(&d, "M%s %s", f(x), f(y))
			case s.Step:
				fmt.Fprintf(&d, " H%s V%s", f(x), f(y))
			default:
				fmt.Fprintf(&d, " L%s %s", f(x), f(y))
			}
		}
		cv.p(`<path d="%s" fill="none" stroke="%s" stroke-width="1.6"><title>%s</title></path>`+"\n", d.String(), color, esc(s.Name))
		if len(s.Points) == 1 {
			cv.p(`<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", f(cv.px(s.Points[0].X)), f(cv.py(s.Points[0].Y)), color)
		}
	}
}

// legend names every series, with its colour, right of the plot.
func (cv *canvas) legend(ss []Series) {
	lx := float64(cv.width-marginRight) + 14
	for i, s := range ss {
		y := float64(marginTop) + 8 + float64(i)*20
		cv.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="3"/>`+"\n", f(lx), f(y), f(lx+18), f(y), palette[i%len(palette)])
		cv.p(`<text x="%s" y="%s" dy="4">%s</text>`+"\n", f(lx+24), f(y), esc(s.Name))
	}
}

// hasPoints says whether any series has a point.
func (c *Chart) hasPoints() bool {
	for _, s := range c.Series {
		if len(s.Points) > 0 {
			return true
		}
	}
	return false
}

func (c *Chart) validate() error {
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	for _, s := range c.Series {
		for _, pt := range s.Points {
			if bad(pt.X) || bad(pt.Y) {
				return fmt.Errorf("chart %q: series %q has a non-finite point (%v, %v)", c.Title, s.Name, pt.X, pt.Y)
			}
		}
	}
	for _, m := range c.Markers {
		if bad(m.X) {
			return fmt.Errorf("chart %q: marker %q is at a non-finite position", c.Title, m.Label)
		}
	}
	if c.YMin != nil && bad(*c.YMin) {
		return errors.New("chart " + strconv.Quote(c.Title) + ": YMin is not finite")
	}
	return nil
}

// bounds returns the data range, widened so that it is never empty.
func (c *Chart) bounds() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	ymin, ymax = 0, math.Inf(-1)
	if c.YMin != nil {
		ymin = *c.YMin
	}
	for _, s := range c.Series {
		for _, pt := range s.Points {
			xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
			ymin, ymax = math.Min(ymin, pt.Y), math.Max(ymax, pt.Y)
		}
	}
	for _, m := range c.Markers {
		xmin, xmax = math.Min(xmin, m.X), math.Max(xmax, m.X)
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax = 0, 1
	}
	if math.IsInf(ymax, -1) {
		ymax = ymin + 1
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	return xmin, xmax, ymin, ymax
}

// ticks returns round tick values (1, 2 or 5 times a power of ten apart)
// covering [lo, hi] with about n intervals.
func ticks(lo, hi float64, n int) []float64 {
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := math.Floor(lo/step) * step
	end := math.Ceil(hi/step) * step
	var out []float64
	for v := start; v <= end+step/2; v += step {
		// Avoid -0 and accumulated float noise in labels.
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

// label writes a tick value without float noise: 0.1, 2, 1500, 2.5k.
func label(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
	}
}

// f writes a pixel coordinate with one decimal.
func f(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// esc escapes text for XML content and attributes.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
