package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/fixture.golden")

// The fixture module holds every kind of feature, and what must be left
// out: an internal package, a command, a nested module, a test file and
// unexported names.
const fixture = "testdata/fixture"

func TestGolden(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-root", fixture}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	golden := filepath.Join("testdata", "fixture.golden")
	if *update {
		if err := os.WriteFile(golden, stdout.Bytes(), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != string(want) {
		t.Errorf("the API differs from %s (go test -update rewrites it):\n%s", golden, got)
	}
	for _, absent := range []string{"Hidden", "Helper", "Exported", "FromTest", "unexportedMode", "private", "priv ", "hidden int", "inner"} {
		if strings.Contains(stdout.String(), absent) {
			t.Errorf("the API lists %q, which is not public", absent)
		}
	}
	if n := strings.Count(stdout.String(), "unexported"); n != 1 {
		t.Errorf("%d mentions of unexported, want only Store's unexported methods line", n)
	}
}

func TestCount(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-root", fixture, "-count"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	// fixture: 8 constants, 3 functions, 10 types, 2 variables; methods
	// declared on Base (2), Options (2) and Pair (2), not the method on
	// the unexported inner nor the interfaces' methods. sub: Timeout,
	// Clock, Level and Level.String.
	want := [][]string{
		{"package", "names", "methods", "names+methods"},
		{"example.com/fixture", "23", "6", "29"},
		{"example.com/fixture/sub", "3", "1", "4"},
		{"total:", "2", "packages", "26", "7", "33"},
	}
	rows := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), stdout.String())
	}
	for i, row := range rows {
		if got := strings.Fields(row); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("row %d = %q, want %q", i, got, want[i])
		}
	}
}

func TestCheck(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "fixture.golden"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	current := filepath.Join(dir, "current.txt")
	if code := run([]string{"-root", fixture, "-o", current}, new(bytes.Buffer), new(bytes.Buffer)); code != 0 {
		t.Fatalf("-o exited %d", code)
	}
	var stderr bytes.Buffer
	if code := run([]string{"-root", fixture, "-check", current}, new(bytes.Buffer), &stderr); code != 0 {
		t.Fatalf("-check of the file -o wrote exited %d: %s", code, stderr.String())
	}

	// A file that lost one feature and has one the code no longer has.
	const gone = "pkg example.com/fixture, func Sum[$0 Number](...$0) $0"
	const stale = "pkg example.com/fixture, func Removed()"
	if !bytes.Contains(golden, []byte(gone+"\n")) {
		t.Fatalf("the golden file has no line %q", gone)
	}
	changed := strings.Replace(string(golden), gone+"\n", stale+"\n", 1)
	file := filepath.Join(dir, "api.txt")
	if err := os.WriteFile(file, []byte(changed), 0o666); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := run([]string{"-root", fixture, "-check", file}, new(bytes.Buffer), &stderr); code != 1 {
		t.Fatalf("-check of a changed file exited %d, want 1: %s", code, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{"-" + stale + "\n", "+" + gone + "\n", "go run ./tools/apifile -root " + fixture + " -o " + file} {
		if !strings.Contains(out, want) {
			t.Errorf("-check output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n+") + strings.Count(out, "\n-"); n != 2 {
		t.Errorf("-check printed %d changed lines, want 2:\n%s", n, out)
	}

	// A missing file is stale too: every line is new.
	stderr.Reset()
	if code := run([]string{"-root", fixture, "-check", filepath.Join(dir, "missing.txt")}, new(bytes.Buffer), &stderr); code != 1 {
		t.Fatalf("-check of a missing file exited %d, want 1", code)
	}
	if n := strings.Count(stderr.String(), "\n+pkg "); n != bytes.Count(golden, []byte("\n")) {
		t.Errorf("-check of a missing file printed %d added lines, want %d", n, bytes.Count(golden, []byte("\n")))
	}
}
