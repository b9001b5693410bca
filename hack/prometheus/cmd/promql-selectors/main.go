// Command promql-selectors parses PromQL expressions with Prometheus's own
// parser and names the metrics each one selects, so that kshard's tests can
// hold the queries of its alerts, dashboard and autoscalers to the metrics a
// replica really exports, without the main module depending on Prometheus.
//
// It reads a JSON array of expressions on stdin and writes a JSON array of
// results in the same order: the metric names an expression selects, or why
// it does not parse.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// result is what one expression selects.
type result struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors: reading a JSON array of expressions:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	out := make([]result, len(exprs))
	for i, e := range exprs {
		out[i] = selects(p, e)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors:", err)
		os.Exit(1)
	}
}

// selects parses one expression and lists the metric names of its
// selectors; a selector without a literal name is an error, since its
// metric could not be checked.
func selects(p parser.Parser, expr string) result {
	r := result{Expr: expr}
	ast, err := p.ParseExpr(expr)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	names := map[string]bool{}
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			r.Error = fmt.Sprintf("selector %s names no metric", vs)
			return nil
		}
		names[name] = true
		return nil
	})
	for n := range names {
		r.Metrics = append(r.Metrics, n)
	}
	sort.Strings(r.Metrics)
	return r
}
