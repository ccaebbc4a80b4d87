// Command apifile writes down the exported API of a Go module's public
// packages, one line per exported feature in the format of Go's own
// api/go1.*.txt files, so that a change to the API shows in review as a
// change to a checked-in file and CI can refuse a change that forgot it.
//
//	go run ./tools/apifile -o api/watermill-idempotent.txt    # make api
//	go run ./tools/apifile -check api/watermill-idempotent.txt # make api-check
//	go run ./tools/apifile -count
//
// The packages are those of the module at -root (the directory of its
// go.mod) whose import path has no "internal" element and that are not
// commands; test files and the other modules of a repository (nested
// go.mod directories) are left out. The module is loaded with GOWORK=off:
// the file describes the module as users get it, whatever the workspace.
//
// -count prints, per package, the exported top-level names and the
// exported methods declared on exported non-interface types (a method
// counted once whatever its receiver), and the totals.
//
// It exits 1 when -check finds the file stale (printing the lines added
// and removed and the command that regenerates it) and 2 on any other
// error.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("apifile", flag.ContinueOnError)
	fset.SetOutput(stderr)
	root := fset.String("root", ".", "the module's directory (its go.mod)")
	out := fset.String("o", "", "write the API to this `file` instead of standard output")
	check := fset.String("check", "", "exit 1 when this `file` is not the API the module has")
	count := fset.Bool("count", false, "print the exported names and methods per package")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(stderr, "apifile: unexpected arguments %q\n", fset.Args())
		return 2
	}

	apis, err := load(*root)
	if err != nil {
		fmt.Fprintf(stderr, "apifile: %v\n", err)
		return 2
	}
	var text bytes.Buffer
	for _, a := range apis {
		for _, f := range a.features {
			text.WriteString(f)
			text.WriteByte('\n')
		}
	}

	switch {
	case *count:
		printCount(stdout, apis)
	case *out == "" && *check == "":
		stdout.Write(text.Bytes())
	}
	if *out != "" {
		if err := os.WriteFile(*out, text.Bytes(), 0o666); err != nil {
			fmt.Fprintf(stderr, "apifile: %v\n", err)
			return 2
		}
	}
	if *check != "" {
		old, err := os.ReadFile(*check)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "apifile: %v\n", err)
			return 2
		}
		if !bytes.Equal(old, text.Bytes()) {
			fmt.Fprintf(stderr, "%s is not the exported API of the module at %s (- in the file, + in the code):\n", *check, *root)
			diff(stderr, lines(string(old)), lines(text.String()))
			fmt.Fprintf(stderr, "regenerate it with: go run ./tools/apifile -root %s -o %s\n", *root, *check)
			return 1
		}
	}
	return 0
}

// load describes every public package of the module at root, sorted by
// import path.
func load(root string) ([]*pkgAPI, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedModule,
		Dir:  root,
		Env:  append(os.Environ(), "GOWORK=off"),
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	var apis []*pkgAPI
	var errs []error
	for _, p := range pkgs {
		if p.Module == nil || !p.Module.Main || p.Name == "main" ||
			slices.Contains(strings.Split(p.PkgPath, "/"), "internal") {
			continue
		}
		for _, e := range p.Errors {
			errs = append(errs, e)
		}
		if p.Types != nil {
			apis = append(apis, describe(p.Types))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(apis) == 0 {
		return nil, fmt.Errorf("no public package in the module at %s", root)
	}
	slices.SortFunc(apis, func(a, b *pkgAPI) int { return strings.Compare(a.path, b.path) })
	return apis, nil
}

func printCount(w io.Writer, apis []*pkgAPI) {
	var names, methods int
	width := len("package")
	for _, a := range apis {
		width = max(width, len(a.path))
		names += a.names
		methods += a.methods
	}
	total := fmt.Sprintf("total: %d packages", len(apis))
	width = max(width, len(total))
	row := func(name string, n, m, nm any) {
		fmt.Fprintf(w, "%-*s  %5v  %7v  %13v\n", width, name, n, m, nm)
	}
	row("package", "names", "methods", "names+methods")
	for _, a := range apis {
		row(a.path, a.names, a.methods, a.names+a.methods)
	}
	row(total, names, methods, names+methods)
}

func lines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// diff prints the lines only in old with -, then those only in new with +.
// The files are sorted sets of lines, so this is the whole difference
// unless the file was reordered by hand.
func diff(w io.Writer, old, new []string) {
	inOld := map[string]bool{}
	for _, l := range old {
		inOld[l] = true
	}
	inNew := map[string]bool{}
	for _, l := range new {
		inNew[l] = true
	}
	same := true
	for _, l := range old {
		if !inNew[l] {
			fmt.Fprintf(w, "-%s\n", l)
			same = false
		}
	}
	for _, l := range new {
		if !inOld[l] {
			fmt.Fprintf(w, "+%s\n", l)
			same = false
		}
	}
	if same {
		fmt.Fprintln(w, "(the same lines in another order or spacing)")
	}
}
