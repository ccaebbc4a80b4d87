package metrics_test

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

const dashboardFile = "../docs/grafana/watermill-idempotent.json"

// registeredSeries returns every series name the metrics package exports
// (histograms as _bucket, _sum and _count) with its label names, gathered
// from a registry after every collector has been touched once.
func registeredSeries(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	m.ObserveDelivery(t.Context(), idempotency.Delivery{Scope: "c", Outcome: idempotency.OutcomeProcessed, Claim: time.Millisecond, Total: time.Millisecond})
	m.ObserveJanitorBatch(t.Context(), janitor.Batch{Deleted: 1})
	m.ObserveJanitorBatch(t.Context(), janitor.Batch{Err: errors.New("boom")})
	m.SetRecords("c", "stale", 1)
	m.ObserveRelayBatch(t.Context(), outbox.RelayBatch{Relay: "r", Claimed: 1, Published: 1, DeadLettered: 1, DeadLetterFailures: 1, Duration: time.Millisecond, Lag: []time.Duration{time.Millisecond}})
	m.ObserveRelayBatch(t.Context(), outbox.RelayBatch{Relay: "r", Err: errors.New("boom")})
	m.ObserveBacklog(t.Context(), outbox.Backlog{Relay: "r", Messages: 1, OldestAge: time.Second, DeadLetters: 1})

	families, err := reg.Gather()
	require.NoError(t, err)
	series := map[string][]string{}
	for _, f := range families {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		if f.GetType().String() == "HISTOGRAM" {
			series[f.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			series[f.GetName()+"_sum"] = labels
			series[f.GetName()+"_count"] = labels
			continue
		}
		series[f.GetName()] = labels
	}
	return series
}

// dashboardExpressions returns every PromQL expression in the dashboard:
// the panels' targets (also inside collapsed rows) and the query
// variables' label_values(...) queries.
func dashboardExpressions(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is not valid JSON")
	var exprs []string
	var walk func([]dashPanel)
	walk = func(panels []dashPanel) {
		for _, p := range panels {
			for _, target := range p.Targets {
				require.NotEmpty(t, target.Expr, "panel %q has a target without expr", p.Title)
				exprs = append(exprs, target.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		require.NoError(t, json.Unmarshal(v.Query, &q))
		exprs = append(exprs, q.Query)
	}
	return exprs
}

type dashPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// The expressions are taken apart with regular expressions, not a PromQL
// parser: github.com/prometheus/prometheus is not a dependency of this
// module, and the dashboard uses a small, regular subset of PromQL.
var (
	stringLit = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// A metric name of this package followed by an optional matcher set.
	selector = regexp.MustCompile(`\b(` + metrics.DefaultNamespace + `_[a-z_]+)\s*(\{[^}]*\})?`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	grouping = regexp.MustCompile(`\b(by|without|on|ignoring)\s*\(([^)]*)\)`)
	// label_values(metric, label)
	labelValues = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
	// Any identifier in the namespace, to catch names the selector misses.
	anyName = regexp.MustCompile(`\b` + metrics.DefaultNamespace + `_[a-zA-Z0-9_]*`)
)

// checkExpression returns the problems of one expression.
func checkExpression(expr string, series map[string][]string) []string {
	var problems []string
	used := map[string]bool{} // labels of the metrics the expression reads
	for _, name := range anyName.FindAllString(expr, -1) {
		labels, ok := series[name]
		if !ok {
			problems = append(problems, "unknown metric "+name)
			continue
		}
		for _, l := range labels {
			used[l] = true
		}
	}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		labels := series[m[1]]
		for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
			if labels != nil && !slices.Contains(labels, lm[1]) {
				problems = append(problems, "metric "+m[1]+" has no label "+lm[1])
			}
		}
	}
	// Label values may contain anything; blank them before reading
	// grouping clauses.
	bare := stringLit.ReplaceAllString(expr, `""`)
	for _, g := range grouping.FindAllStringSubmatch(bare, -1) {
		for l := range strings.SplitSeq(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !used[l] {
				problems = append(problems, g[1]+" ("+l+"): no metric in the expression has label "+l)
			}
		}
	}
	for _, lv := range labelValues.FindAllStringSubmatch(expr, -1) {
		if labels, ok := series[lv[1]]; ok && !slices.Contains(labels, lv[2]) {
			problems = append(problems, "label_values: metric "+lv[1]+" has no label "+lv[2])
		}
	}
	return problems
}

func TestDashboardNamesOnlyRegisteredMetricsAndLabels(t *testing.T) {
	series := registeredSeries(t)
	exprs := dashboardExpressions(t)
	require.GreaterOrEqual(t, len(exprs), 15)
	seen := map[string]bool{}
	for _, e := range exprs {
		require.NotEmpty(t, anyName.FindAllString(e, -1), "expression names no metric of this package: %s", e)
		require.Empty(t, checkExpression(e, series), "expression: %s", e)
		for _, name := range anyName.FindAllString(e, -1) {
			seen[strings.TrimSuffix(name, "_bucket")] = true
		}
	}
	// Every family the package registers has a panel.
	for name := range series {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		require.True(t, seen[base] || seen[name], "no panel shows %s", base)
	}
}

// The checker itself catches the mistakes it exists for.
func TestDashboardCheckerCatchesMistakes(t *testing.T) {
	series := registeredSeries(t)
	for expr, want := range map[string]string{
		`rate(watermill_idempotent_deliveries_totl[5m])`:                                     "unknown metric watermill_idempotent_deliveries_totl",
		`watermill_idempotent_records{relay="x"}`:                                            "metric watermill_idempotent_records has no label relay",
		`sum by (relay) (rate(watermill_idempotent_deliveries_total[5m]))`:                   "by (relay)",
		`histogram_quantile(0.9, sum by (le) (watermill_idempotent_claim_duration_seconds))`: "unknown metric watermill_idempotent_claim_duration_seconds",
		`label_values(watermill_idempotent_records, relay)`:                                  "label_values: metric watermill_idempotent_records has no label relay",
	} {
		problems := checkExpression(expr, series)
		require.NotEmpty(t, problems, expr)
		require.Contains(t, strings.Join(problems, "; "), want, expr)
	}
	require.Empty(t, checkExpression(`sum by (consumer, le) (rate(watermill_idempotent_claim_duration_seconds_bucket{consumer=~"a|b,c"}[5m]))`, series))
}
