package robustness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Profile is one run of the suite: every backend under every one of its
// faults, a Workload each.
type Profile struct {
	// Name is "robust" or "robust-full".
	Name string
	// Backends to run, by name (see BackendNames); all when empty.
	Backends []string
	// Duration of each backend × fault cell.
	Duration time.Duration
	// FaultEvery is the interval between two injections of the fault.
	FaultEvery time.Duration
	// Workload is the traffic of each cell.
	Workload Workload
	// CheckTimeout bounds the check of each key's history; a key not
	// decided in time is counted as undecided, not as linearizable.
	CheckTimeout time.Duration
	// VisualizeDir is where failing histories are written as porcupine's
	// HTML visualization; default the temporary directory.
	VisualizeDir string
}

// Short is the profile make chaos-ci runs: a few seconds per cell, well
// under three minutes in all.
func Short() Profile {
	return Profile{Name: "robust", Duration: 4 * time.Second, FaultEvery: 1200 * time.Millisecond, CheckTimeout: 10 * time.Second}
}

// Full is the long profile: a minute per cell.
func Full() Profile {
	return Profile{Name: "robust-full", Duration: time.Minute, FaultEvery: 4 * time.Second, CheckTimeout: 30 * time.Second}
}

// Result is one cell of the anomaly table.
type Result struct {
	Backend, Fault string
	// Skipped names the missing prerequisite when the backend could not
	// be opened.
	Skipped string
	// Injected counts the faults injected.
	Injected int
	// Expected gives the reason where the fault is expected to break the
	// contract (see expected): its anomalies are counted, not a failure.
	Expected string
	Check
	// Err is a failure of the run itself (a fault that could not be
	// injected), not of the store.
	Err error
}

// Check is the verdict on one history.
type Check struct {
	// Ops is the number of calls checked; Unknown of them had an unknown
	// outcome.
	Ops, Unknown int
	// Keys is the number of keys (partitions) checked.
	Keys int
	// Anomalies is the number of keys whose history no sequential store
	// could have produced.
	Anomalies int
	// Undecided is the number of keys the checker ran out of time on.
	Undecided int
	// Visualization is the HTML file of the anomalous keys' histories,
	// when there are any and it could be written.
	Visualization string
}

// Linearizable reports whether every key's history was found
// linearizable.
func (c Check) Linearizable() bool { return c.Anomalies == 0 && c.Undecided == 0 }

// CheckHistory checks each key's history against Model, within timeout
// per key, and when some key is not linearizable writes the
// visualization of those keys (at most five) to visualizePath, if set.
func CheckHistory(history []porcupine.Operation, timeout time.Duration, visualizePath string) (Check, error) {
	c := Check{Ops: len(history)}
	for _, op := range history {
		if op.Output.(Output).Unknown {
			c.Unknown++
		}
	}
	single := Model
	single.Partition = nil
	var bad []porcupine.Operation
	shown := 0
	for _, part := range partition(history) {
		c.Keys++
		switch porcupine.CheckOperationsTimeout(single, part, timeout) {
		case porcupine.Illegal:
			c.Anomalies++
			if shown < 5 {
				bad = append(bad, part...)
				shown++
			}
		case porcupine.Unknown:
			c.Undecided++
		}
	}
	if len(bad) == 0 || visualizePath == "" {
		return c, nil
	}
	_, info := porcupine.CheckOperationsVerbose(Model, bad, timeout)
	if err := porcupine.VisualizePath(Model, info, visualizePath); err != nil {
		return c, fmt.Errorf("robustness: writing the visualization: %w", err)
	}
	c.Visualization = visualizePath
	return c, nil
}

// Run runs profile p: for each backend, a cell per fault. Progress goes to
// log. A backend whose service is missing gives a row with Skipped set.
func Run(ctx context.Context, p Profile, log io.Writer) []Result {
	names := p.Backends
	if len(names) == 0 {
		names = BackendNames
	}
	if p.VisualizeDir == "" {
		p.VisualizeDir = os.TempDir()
	}
	var results []Result
	for _, name := range names {
		b, err := OpenBackend(ctx, name)
		if err != nil {
			fmt.Fprintf(log, "robustness: %s: skipped: %v\n", name, err)
			results = append(results, Result{Backend: name, Skipped: err.Error()})
			continue
		}
		for _, f := range b.Faults {
			if ctx.Err() != nil {
				break
			}
			r := RunCell(ctx, p, b, f)
			fmt.Fprintf(log, "robustness: %s × %s: %d ops (%d unknown), %d keys, %d anomalies, %d undecided, %d faults injected%s\n",
				r.Backend, r.Fault, r.Ops, r.Unknown, r.Keys, r.Anomalies, r.Undecided, r.Injected, errText(r.Err))
			if r.Visualization != "" {
				fmt.Fprintf(log, "robustness: the failing history: %s\n", r.Visualization)
			}
			results = append(results, r)
		}
		b.Close()
	}
	return results
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "; error: " + err.Error()
}

// RunCell runs p's workload on b for p.Duration while f is injected every
// p.FaultEvery, then checks the history.
func RunCell(ctx context.Context, p Profile, b *Backend, f Fault) Result {
	r := Result{Backend: b.Name, Fault: f.Name, Expected: expected(b.Name, f)}
	cctx, cancel := context.WithTimeout(ctx, p.Duration)
	defer cancel()
	var wg sync.WaitGroup
	var faultErr error
	if f.Inject != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(p.FaultEvery)
			defer tick.Stop()
			for {
				select {
				case <-cctx.Done():
					return
				case <-tick.C:
				}
				if err := f.Inject(ctx); err != nil {
					faultErr = err
					return
				}
				r.Injected++
			}
		}()
	}
	history := p.Workload.Record(cctx, b.Store, b.Tx)
	wg.Wait()
	path := filepath.Join(p.VisualizeDir, fmt.Sprintf("robustness-%s-%s.html", b.Name, strings.ReplaceAll(f.Name, " ", "-")))
	c, err := CheckHistory(history, p.CheckTimeout, path)
	r.Check, r.Err = c, errors.Join(faultErr, err)
	return r
}

// OK reports whether every cell that ran kept the contract, apart from
// those where a loss is expected.
func OK(results []Result) bool {
	for _, r := range results {
		if r.Skipped == "" && (r.Err != nil || r.Undecided > 0 || r.Anomalies > 0 && r.Expected == "") {
			return false
		}
	}
	return true
}

// PrintTable writes the anomaly table, backend × fault, in Markdown.
func PrintTable(w io.Writer, results []Result) {
	fmt.Fprintln(w, "| backend | fault | faults injected | ops checked (unknown outcome) | keys | linearizable | anomalies (keys) |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|---|--:|")
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(w, "| %s | — | — | — | — | skipped: %s | — |\n", r.Backend, r.Skipped)
			continue
		}
		verdict := "yes"
		switch {
		case r.Err != nil:
			verdict = "error: " + strings.Join(strings.Fields(r.Err.Error()), " ")
		case r.Anomalies > 0 && r.Expected != "":
			verdict = "**no** (expected: " + r.Expected + ")"
		case r.Anomalies > 0:
			verdict = "**no**"
		case r.Undecided > 0:
			verdict = fmt.Sprintf("undecided (%d keys)", r.Undecided)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d (%d) | %d | %s | %d |\n", r.Backend, r.Fault, r.Injected, r.Ops, r.Unknown, r.Keys, verdict, r.Anomalies)
	}
}

// expected gives the reason why fault f on backend is expected to break
// the contract, or "". A Redis without persistence restarted forgets
// every record, so a key claimed before the restart can be claimed
// again. And go-redis retries a command whose connection broke
// (Options.MaxRetries, 3 by default) — a script that had already run
// included: the caller gets the second run's answer, for example an
// Acquire that finds its own claim and reports it taken. The
// redis-aof-noretry backend, with retries off, is the control.
func expected(backend string, f Fault) string {
	switch {
	case backend == "redis" && f.Name == redisRestart:
		return "no persistence: state lost, and client retries"
	case (backend == "redis" || backend == "redis-aof") && f.Name != "none":
		// CLIENT KILL too, when it cuts a connection mid-script.
		return "go-redis retried a script that had run"
	}
	return ""
}
