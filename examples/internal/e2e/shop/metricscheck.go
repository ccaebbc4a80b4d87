package shop

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
)

// ServedMetrics fetches http://addr/metrics and returns the metric family
// names it serves and the whole body.
func ServedMetrics(addr string) (names []string, body string, err error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, "", fmt.Errorf("scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("scraping metrics: %w", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				seen[f[0]] = true
			}
		}
	}
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, string(b), nil
}

var documentedMetric = regexp.MustCompile(`watermill_idempotent_[a-z_]+`)

// DocumentedMetrics returns the metric names a Markdown file mentions
// (docs/observability.md), histogram series suffixes stripped.
func DocumentedMetrics(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range documentedMetric.FindAllString(string(b), -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(m, "_seconds"+suffix) {
				m = strings.TrimSuffix(m, suffix)
			}
		}
		out[m] = true
	}
	return out, nil
}
