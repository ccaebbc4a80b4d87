// Command testsummary reads `go test -json` on standard input, prints what
// a plain `go test` run prints (a line per package, the output of every
// failed test) and ends with one line that says what was skipped: the
// services that were down and the count of skipped tests. make test and
// make test-short pipe through it, so a green run that skipped half the
// suite for a missing server cannot pass unnoticed.
//
//	go test -json ./... | go run ./tools/testsummary
//
// It exits 1 when a test or a package failed, or when the input has no
// test event at all (a build that never ran).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output and build-fail events (Go 1.24+)
}

// missing matches internal/testsupport/testenv's skip message: "skipping: <service>
// is not available: …". The service may carry its setting in brackets.
var missing = regexp.MustCompile(`skipping: (.+?)(?: \([A-Z_]+=.*?\))? is not available`)

// summary accumulates the run.
type summary struct {
	out                     io.Writer
	passed, failed, skipped int
	failedPkgs              int
	down                    map[string]int // service → tests skipped for it
	short                   int            // tests skipped for another reason (-short, features)
	buf                     map[string][]string
	events                  int
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, down: map[string]int{}, buf: map[string][]string{}}
}

func (s *summary) add(e event) {
	s.events++
	id := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.out, e.Output)
	case "build-fail":
		s.failedPkgs++
	case "output":
		if e.Test == "" {
			// Package lines: "ok  pkg 1.2s", "FAIL pkg", "?  pkg [no test
			// files]", build errors. Test chatter (=== RUN, --- PASS) is
			// dropped as go test without -v drops it.
			if !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "PASS") && !strings.HasPrefix(e.Output, "testing: warning") {
				fmt.Fprint(s.out, e.Output)
			}
			return
		}
		s.buf[id] = append(s.buf[id], e.Output)
	case "pass":
		if e.Test != "" {
			s.passed++
		}
		delete(s.buf, id)
	case "skip":
		if e.Test == "" {
			return
		}
		s.skipped++
		if svc := serviceOf(s.buf[id]); svc != "" {
			s.down[svc]++
		} else {
			s.short++
		}
		delete(s.buf, id)
	case "fail":
		if e.Test == "" {
			s.failedPkgs++
			return
		}
		s.failed++
		for _, line := range s.buf[id] {
			fmt.Fprint(s.out, line)
		}
		delete(s.buf, id)
	}
}

// serviceOf finds the missing service in a skipped test's output.
func serviceOf(lines []string) string {
	for _, l := range lines {
		if m := missing.FindStringSubmatch(l); m != nil {
			return m[1]
		}
	}
	return ""
}

// line is the closing line.
func (s *summary) line() string {
	down := "none"
	if len(s.down) > 0 {
		names := make([]string, 0, len(s.down))
		for svc, n := range s.down {
			names = append(names, fmt.Sprintf("%s (%d tests)", svc, n))
		}
		slices.Sort(names)
		down = strings.Join(names, ", ")
	}
	return fmt.Sprintf("test summary: %d passed, %d failed, %d skipped (%d for a service that was down, %d by -short or a backend's features), %d packages failed; services down: %s",
		s.passed, s.failed, s.skipped, s.skipped-s.short, s.short, s.failedPkgs, down)
}

func (s *summary) ok() bool { return s.failed == 0 && s.failedPkgs == 0 && s.events > 0 }

func run(in io.Reader, out io.Writer) bool {
	s := newSummary(out)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event: a build error printed by go test itself.
			fmt.Fprintln(out, sc.Text())
			continue
		}
		s.add(e)
	}
	fmt.Fprintln(out, s.line())
	return s.ok()
}

func main() {
	if !run(os.Stdin, os.Stdout) {
		os.Exit(1)
	}
}
