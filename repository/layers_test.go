package repository_test

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/idemkit/watermill-idempotent"

// layerRule is one rule on the imports (not the tests' imports) of the
// packages in and below dir, relative to the module root.
type layerRule struct {
	dir string
	// forbidden reports why importing the module path imp breaks the rule,
	// "" when it does not.
	forbidden func(imp string) string
}

// under reports whether the module path imp is dir or below it.
func under(imp, dir string) bool {
	p := module + "/" + dir
	return imp == p || strings.HasPrefix(imp, p+"/")
}

// isLeaf reports whether the module package imp imports nothing of the
// module.
func isLeaf(t *testing.T, imp string) bool {
	pkg, err := build.ImportDir(filepath.Join("..", strings.TrimPrefix(imp, module+"/")), 0)
	if err != nil {
		t.Fatal(err)
	}
	return !slices.ContainsFunc(pkg.Imports, func(i string) bool { return strings.HasPrefix(i, module+"/") })
}

// notMiddleware refuses the inbox middleware, the Watermill adapter.
func notMiddleware(imp string) string {
	if under(imp, "middleware") {
		return "the inbox middleware"
	}
	return ""
}

// TestLayersPointOneWay checks, from the packages' imports as go/build
// reads them, that layers point one way:
//   - the storage contracts (repository) import nothing of an
//     implementation: no internal/ package, only module packages that are
//     leaves themselves (sqldialect, resultcodec);
//   - the middleware imports no backend and nothing of the
//     SQL implementation (internal/sqlstore);
//   - the outbox (and pgxoutbox), once, httpidem and tracing work without
//     the inbox middleware, the Watermill adapter: what they share with it
//     is in package idempotency, which imports neither.
func TestLayersPointOneWay(t *testing.T) {
	backends := []string{"repository/postgres", "repository/mysql", "repository/sqlite", "repository/redis", "repository/memory"}
	rules := []layerRule{
		{dir: "repository", forbidden: func(imp string) string {
			switch {
			case strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal"):
				return "an internal package (the contracts import nothing of an implementation)"
			case !isLeaf(t, imp):
				return "not a leaf (the contracts import only leaves of the module)"
			}
			return ""
		}},
		{dir: "middleware", forbidden: func(imp string) string {
			if slices.ContainsFunc(backends, func(b string) bool { return under(imp, b) }) {
				return "a backend"
			}
			if under(imp, "internal/sqlstore") {
				return "the SQL implementation"
			}
			return ""
		}},
		{dir: "outbox", forbidden: notMiddleware},
		{dir: "once", forbidden: notMiddleware},
		{dir: "httpidem", forbidden: notMiddleware},
		{dir: "tracing", forbidden: notMiddleware},
		{dir: "idempotency", forbidden: func(imp string) string {
			if r := notMiddleware(imp); r != "" {
				return r
			}
			for _, p := range []string{"once", "httpidem", "outbox"} {
				if under(imp, p) {
					return "an entry point (the vocabulary is below them)"
				}
			}
			return ""
		}},
	}
	for _, rule := range rules {
		for _, dir := range packageDirs(t, filepath.Join("..", rule.dir), func(string) bool { return false }) {
			// The contracts' rule is on the package itself, not on the
			// backends and tools below it.
			if rule.dir == "repository" && dir != filepath.Join("..", "repository") {
				continue
			}
			pkg, err := build.ImportDir(dir, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range pkg.Imports {
				if !strings.HasPrefix(imp, module+"/") {
					continue
				}
				if why := rule.forbidden(imp); why != "" {
					t.Errorf("%s imports %s: %s", strings.TrimPrefix(filepath.ToSlash(dir), "../"), imp, why)
				}
			}
		}
	}
}

// packageDirs returns root and the directories below it that hold a Go
// package, skipping testdata and the directories skip reports (with
// everything below them).
func packageDirs(t *testing.T, root string, skip func(dir string) bool) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" || p != root && skip(p) {
			return filepath.SkipDir
		}
		if _, err := build.ImportDir(p, 0); err == nil {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestNoLibraryPackageImportsTestSupport checks that internal/testsupport
// (service addresses, backends for the suites, trace recorders) is
// reached only by tests: no non-test file of a package of the library
// module imports it, directly or through another module package.
func TestNoLibraryPackageImportsTestSupport(t *testing.T) {
	support := module + "/internal/testsupport"
	// Other modules of the repository have a go.mod of their own; the
	// test support itself may import its own packages.
	other := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "go.mod"))
		return err == nil || filepath.ToSlash(dir) == "../internal/testsupport"
	}
	imports := map[string][]string{}
	for _, dir := range packageDirs(t, "..", other) {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		imports[module+strings.TrimPrefix(filepath.ToSlash(dir), "..")] = pkg.Imports
	}
	require.NotEmpty(t, imports[module+"/middleware"], "the walk found the library's packages")
	var reaches func(pkg string, seen map[string]bool) bool
	reaches = func(pkg string, seen map[string]bool) bool {
		if seen[pkg] {
			return false
		}
		seen[pkg] = true
		for _, imp := range imports[pkg] {
			if imp == support || strings.HasPrefix(imp, support+"/") || reaches(imp, seen) {
				return true
			}
		}
		return false
	}
	for pkg := range imports {
		if reaches(pkg, map[string]bool{}) {
			t.Errorf("%s reaches %s outside its tests", pkg, support)
		}
	}
}
