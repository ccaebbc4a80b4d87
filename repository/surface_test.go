package repository_test

import (
	"go/build"
	"go/importer"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNoExportedSignatureNamesAnInternalType type-checks every library
// package of the module outside internal/ (not commands, examples or
// nested modules) and fails on an exported name whose signature names a
// type of an internal/ package: a function's parameters or results, an
// exported struct field, a method of an exported type (promoted ones
// included), an alias, a variable or constant. Such a name is one users
// cannot write down, and go doc cannot show what it leads to.
func TestNoExportedSignatureNamesAnInternalType(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the module and its dependencies from source")
	}

	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "source", nil)
	dirs := libraryDirs(t, "..")
	for _, want := range []string{"repository/postgres", "outbox/pgxoutbox", "sqldialect"} {
		if !slices.Contains(dirs, filepath.FromSlash(want)) {
			t.Fatalf("%s is not among the library packages %v", want, dirs)
		}
	}
	for _, dir := range dirs {
		path := module
		if dir != "." {
			path += "/" + filepath.ToSlash(dir)
		}
		pkg, err := imp.(types.ImporterFrom).ImportFrom(path, filepath.Join("..", dir), 0)
		if err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		for _, problem := range internalNames(pkg) {
			t.Errorf("%s.%s", pkg.Name(), problem)
		}
	}
}

// libraryDirs returns the directories below root, relative to it, that
// hold a non-main package of the module and are not under internal/,
// testdata or a nested module.
func libraryDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	for _, dir := range packageDirs(t, root, func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "go.mod"))
		return slices.Contains([]string{"internal", "cmd", "examples", "bench"}, filepath.Base(dir)) ||
			strings.HasPrefix(filepath.Base(dir), ".") || err == nil && dir != root // a module of its own
	}) {
		if pkg, _ := build.ImportDir(dir, 0); pkg.Name != "main" {
			rel, _ := filepath.Rel(root, dir)
			dirs = append(dirs, rel)
		}
	}
	return dirs
}

// internalNames lists pkg's exported names whose signatures name a type
// of an internal/ package, as "Name: the type".
func internalNames(pkg *types.Package) []string {
	var out []string
	report := func(name string, typ types.Type) {
		if bad := internalIn(typ, map[types.Type]bool{}); bad != "" {
			out = append(out, name+": "+bad)
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		tn, ok := obj.(*types.TypeName)
		if !ok {
			report(name, obj.Type()) // functions, variables, constants
			continue
		}
		if alias, ok := obj.Type().(*types.Alias); ok {
			report(name, alias.Rhs())
			continue
		}
		switch u := tn.Type().Underlying().(type) {
		case *types.Struct:
			for f := range u.Fields() {
				if f.Exported() {
					report(name+"."+f.Name(), f.Type())
				}
			}
		case *types.Interface:
			for m := range u.Methods() {
				if m.Exported() {
					report(name+"."+m.Name(), m.Type())
				}
			}
		default:
			report(name, u)
		}
		mset := types.NewMethodSet(types.NewPointer(tn.Type()))
		for sel := range mset.Methods() {
			if sel.Obj().Exported() {
				report(name+"."+sel.Obj().Name(), sel.Type())
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// internalIn returns the first type of an internal/ package that typ
// names (an alias counts as the name it is written with), "" for none.
func internalIn(typ types.Type, seen map[types.Type]bool) string {
	if typ == nil || seen[typ] {
		return ""
	}
	seen[typ] = true
	isInternal := func(obj types.Object) bool {
		return obj.Pkg() != nil && slices.Contains(strings.Split(obj.Pkg().Path(), "/"), "internal")
	}
	switch t := typ.(type) {
	case *types.Alias:
		if isInternal(t.Obj()) {
			return t.Obj().Pkg().Path() + "." + t.Obj().Name()
		}
		return ""
	case *types.Named:
		if isInternal(t.Obj()) {
			return t.Obj().Pkg().Path() + "." + t.Obj().Name()
		}
		for a := range t.TypeArgs().Types() {
			if bad := internalIn(a, seen); bad != "" {
				return bad
			}
		}
		return ""
	case *types.Pointer:
		return internalIn(t.Elem(), seen)
	case *types.Slice:
		return internalIn(t.Elem(), seen)
	case *types.Array:
		return internalIn(t.Elem(), seen)
	case *types.Chan:
		return internalIn(t.Elem(), seen)
	case *types.Map:
		if bad := internalIn(t.Key(), seen); bad != "" {
			return bad
		}
		return internalIn(t.Elem(), seen)
	case *types.Signature:
		if bad := internalIn(t.Params(), seen); bad != "" {
			return bad
		}
		return internalIn(t.Results(), seen)
	case *types.Tuple:
		for v := range t.Variables() {
			if bad := internalIn(v.Type(), seen); bad != "" {
				return bad
			}
		}
	case *types.Struct:
		for f := range t.Fields() {
			if bad := internalIn(f.Type(), seen); bad != "" {
				return bad
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if bad := internalIn(m.Type(), seen); bad != "" {
				return bad
			}
		}
	}
	return ""
}
