package main

import (
	"strings"
	"testing"
)

func TestSummaryNamesDownServicesAndCountsSkips(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    x_test.go:1: skipping: Redis (REDIS_ADDR=127.0.0.1:6379) is not available: dial tcp: refused (start it, or set CI=true to make this a failure)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    x_test.go:2: skipping: PostgreSQL is not available: refused\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestB"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"    x_test.go:3: long test, skipped with -short\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestC"}`,
		`{"Action":"output","Package":"p","Test":"TestD","Output":"--- PASS: TestD\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestD"}`,
		`{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}`,
		`{"Action":"pass","Package":"p"}`,
	}, "\n")
	var out strings.Builder
	if !run(strings.NewReader(in), &out) {
		t.Fatalf("a run with no failure reported failure:\n%s", out.String())
	}
	want := "test summary: 1 passed, 0 failed, 3 skipped (2 for a service that was down, 1 by -short or a backend's features), 0 packages failed; services down: PostgreSQL (1 tests), Redis (1 tests)\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Fatalf("summary line:\n got %q\nwant %q", out.String(), want)
	}
	if !strings.Contains(out.String(), "ok  \tp\t0.1s") {
		t.Fatalf("the package line was not printed:\n%s", out.String())
	}
}

func TestFailedTestIsPrintedAndFailsTheRun(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"output","Package":"p","Test":"TestF","Output":"    f_test.go:9: boom\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestF"}`,
		`{"Action":"fail","Package":"p"}`,
	}, "\n")
	var out strings.Builder
	if run(strings.NewReader(in), &out) {
		t.Fatal("a failed test did not fail the run")
	}
	if !strings.Contains(out.String(), "boom") {
		t.Fatalf("the failed test's output was not printed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "1 failed") || !strings.Contains(out.String(), "services down: none") {
		t.Fatalf("summary: %s", out.String())
	}
}

func TestEmptyInputFails(t *testing.T) {
	var out strings.Builder
	if run(strings.NewReader("# build failed\n"), &out) {
		t.Fatal("a run without test events passed")
	}
	if !strings.Contains(out.String(), "# build failed") {
		t.Fatalf("non-JSON lines are not passed through: %s", out.String())
	}
}

func TestBuildFailureIsPrintedAndFailsTheRun(t *testing.T) {
	in := strings.Join([]string{
		`{"ImportPath":"p","Action":"build-output","Output":"# p\n"}`,
		`{"ImportPath":"p","Action":"build-output","Output":"p/x.go:3:2: undefined: y\n"}`,
		`{"ImportPath":"p","Action":"build-fail"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}`,
		`{"Action":"fail","Package":"p"}`,
	}, "\n")
	var out strings.Builder
	if run(strings.NewReader(in), &out) {
		t.Fatal("a build failure did not fail the run")
	}
	if !strings.Contains(out.String(), "undefined: y") {
		t.Fatalf("the compiler's message was not printed:\n%s", out.String())
	}
}
