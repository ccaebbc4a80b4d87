package main

import (
	"fmt"
	"go/constant"
	"go/types"
	"slices"
	"strconv"
	"strings"
)

// pkgAPI is the exported API of one package: its feature lines and the
// counts -count prints.
type pkgAPI struct {
	path     string
	features []string
	// names counts the exported top-level names; methods the exported
	// methods declared on exported named non-interface types, each once
	// whatever its receiver (T or *T).
	names, methods int
}

// describe lists the exported API of pkg in the format of Go's api/*.txt
// files, one line per feature, sorted.
func describe(pkg *types.Package) *pkgAPI {
	a := &pkgAPI{path: pkg.Path()}
	w := &writer{pkg: pkg}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		a.names++
		switch obj := obj.(type) {
		case *types.Const:
			a.add("const %s = %s", name, constValue(obj.Val()))
			a.add("const %s %s", name, w.constType(obj.Type()))
		case *types.Var:
			a.add("var %s %s", name, w.typeString(obj.Type()))
		case *types.Func:
			sig := obj.Type().(*types.Signature)
			a.add("func %s%s%s", name, w.typeParams(sig.TypeParams()), w.signature(sig))
		case *types.TypeName:
			a.methods += w.typeFeatures(a, obj)
		}
	}
	slices.Sort(a.features)
	a.features = slices.Compact(a.features)
	return a
}

func (a *pkgAPI) add(format string, args ...any) {
	a.features = append(a.features, "pkg "+a.path+", "+fmt.Sprintf(format, args...))
}

// typeFeatures adds the lines of a type declaration: the type, its exported
// fields or interface methods, and the exported methods of the method sets
// of T and *T (promoted ones included, as in Go's files: they are part of
// what callers can call). It returns the number of exported methods
// declared on the type itself.
func (w *writer) typeFeatures(a *pkgAPI, obj *types.TypeName) int {
	if obj.IsAlias() {
		alias := obj.Type().(*types.Alias)
		if tps := alias.TypeParams(); tps.Len() > 0 {
			a.add("type %s%s = %s", obj.Name(), w.typeParams(tps), w.typeString(alias.Rhs()))
		} else {
			a.add("type %s = %s", obj.Name(), w.typeString(types.Unalias(alias)))
		}
		return 0
	}
	named, ok := obj.Type().(*types.Named)
	if !ok { // a type parameter cannot be declared at package level
		return 0
	}
	decl := "type " + obj.Name() + w.typeParams(named.TypeParams())
	switch u := named.Underlying().(type) {
	case *types.Struct:
		a.add("%s struct", decl)
		for f := range u.Fields() {
			switch {
			case !f.Exported():
			case f.Embedded():
				a.add("%s struct, embedded %s", decl, w.typeString(f.Type()))
			default:
				a.add("%s struct, %s %s", decl, f.Name(), w.typeString(f.Type()))
			}
		}
	case *types.Interface:
		var names []string
		unexported := false
		for m := range u.Methods() {
			if !m.Exported() {
				unexported = true
				continue
			}
			names = append(names, m.Name())
			a.add("%s interface, %s%s", decl, m.Name(), w.signature(m.Signature()))
		}
		if len(names) == 0 {
			a.add("%s interface {}", decl)
		} else {
			a.add("%s interface { %s }", decl, strings.Join(names, ", "))
		}
		if unexported {
			a.add("%s interface, unexported methods", decl)
		}
		// A constraint's type set is part of its API: which type
		// arguments it accepts.
		for e := range u.EmbeddedTypes() {
			if i, ok := e.Underlying().(*types.Interface); ok && i.IsMethodSet() {
				continue // its methods are listed above
			}
			a.add("%s interface, %s", decl, w.typeString(e))
		}
		return 0
	default:
		a.add("%s %s", decl, w.typeString(u))
	}

	recv := obj.Name()
	if tps := named.TypeParams(); tps.Len() > 0 {
		params := make([]string, tps.Len())
		for i := range params {
			params[i] = "$" + strconv.Itoa(i)
		}
		recv += "[" + strings.Join(params, ", ") + "]"
	}
	seen := map[string]bool{}
	for _, t := range []types.Type{named, types.NewPointer(named)} {
		r := recv
		if _, ok := t.(*types.Pointer); ok {
			r = "*" + recv
		}
		mset := types.NewMethodSet(t)
		for sel := range mset.Methods() {
			m := sel.Obj()
			if !m.Exported() || seen[m.Name()] {
				continue
			}
			seen[m.Name()] = true
			a.add("method (%s) %s%s", r, m.Name(), w.signature(m.Type().(*types.Signature)))
		}
	}
	declared := 0
	for m := range named.Methods() {
		if m.Exported() {
			declared++
		}
	}
	return declared
}

// constValue is a constant's value as Go's files write it: a float that
// prints inexactly is followed by its exact value.
func constValue(v constant.Value) string {
	switch v.Kind() {
	case constant.Float:
		if s, exact := v.String(), v.ExactString(); s != exact {
			return s + "  // " + exact
		}
	case constant.String:
		// String abbreviates long strings.
		return v.ExactString()
	}
	return v.String()
}

// writer writes types as Go's api files do: names of the package described
// unqualified, others qualified by package name, type parameters as $0, $1,
// … (their index), byte and rune as uint8 and int32, aliases resolved.
type writer struct {
	pkg *types.Package
}

func (w *writer) typeString(t types.Type) string {
	var b strings.Builder
	w.write(&b, t)
	return b.String()
}

func (w *writer) constType(t types.Type) string {
	if b, ok := t.(*types.Basic); ok && b.Info()&types.IsUntyped != 0 {
		switch b.Kind() {
		case types.UntypedBool:
			return "ideal-bool"
		case types.UntypedInt:
			return "ideal-int"
		case types.UntypedRune:
			return "ideal-char"
		case types.UntypedFloat:
			return "ideal-float"
		case types.UntypedComplex:
			return "ideal-complex"
		case types.UntypedString:
			return "ideal-string"
		}
	}
	return w.typeString(t)
}

// typeParams writes a type parameter list with each parameter's
// constraint: [$0 comparable, $1 interface{}].
func (w *writer) typeParams(tps *types.TypeParamList) string {
	if tps.Len() == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := range tps.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		tp := tps.At(i)
		w.write(&b, tp)
		b.WriteByte(' ')
		w.write(&b, tp.Constraint())
	}
	b.WriteByte(']')
	return b.String()
}

// signature writes parameters and results without names:
// (string, ...int) (T, error).
func (w *writer) signature(sig *types.Signature) string {
	var b strings.Builder
	w.writeSignature(&b, sig)
	return b.String()
}

func (w *writer) writeSignature(b *strings.Builder, sig *types.Signature) {
	b.WriteByte('(')
	params := sig.Params()
	for i := range params.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		t := params.At(i).Type()
		if sig.Variadic() && i == params.Len()-1 {
			b.WriteString("...")
			if s, ok := t.(*types.Slice); ok {
				t = s.Elem()
			} // else a string passed as ...byte to append
		}
		w.write(b, t)
	}
	b.WriteByte(')')
	res := sig.Results()
	switch res.Len() {
	case 0:
	case 1:
		b.WriteByte(' ')
		w.write(b, res.At(0).Type())
	default:
		b.WriteString(" (")
		for i := range res.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			w.write(b, res.At(i).Type())
		}
		b.WriteByte(')')
	}
}

func (w *writer) write(b *strings.Builder, t types.Type) {
	switch t := t.(type) {
	case *types.Basic:
		switch t.Kind() {
		case types.Byte:
			b.WriteString("uint8")
		case types.Rune:
			b.WriteString("int32")
		case types.UnsafePointer:
			b.WriteString("unsafe.Pointer")
		default:
			b.WriteString(t.Name())
		}
	case *types.Alias:
		w.write(b, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if pkg := obj.Pkg(); pkg != nil && pkg != w.pkg {
			b.WriteString(pkg.Name())
			b.WriteByte('.')
		}
		b.WriteString(obj.Name())
		if args := t.TypeArgs(); args.Len() > 0 {
			b.WriteByte('[')
			for i := range args.Len() {
				if i > 0 {
					b.WriteString(", ")
				}
				w.write(b, args.At(i))
			}
			b.WriteByte(']')
		}
	case *types.TypeParam:
		b.WriteString("$" + strconv.Itoa(t.Index()))
	case *types.Pointer:
		b.WriteByte('*')
		w.write(b, t.Elem())
	case *types.Slice:
		b.WriteString("[]")
		w.write(b, t.Elem())
	case *types.Array:
		fmt.Fprintf(b, "[%d]", t.Len())
		w.write(b, t.Elem())
	case *types.Map:
		b.WriteString("map[")
		w.write(b, t.Key())
		b.WriteByte(']')
		w.write(b, t.Elem())
	case *types.Chan:
		switch t.Dir() {
		case types.SendRecv:
			b.WriteString("chan ")
		case types.SendOnly:
			b.WriteString("chan<- ")
		case types.RecvOnly:
			b.WriteString("<-chan ")
		}
		w.write(b, t.Elem())
	case *types.Signature:
		b.WriteString("func")
		w.writeSignature(b, t)
	case *types.Struct:
		// Exported fields only, tags left out: struct{ A int; B }.
		var fields []string
		for f := range t.Fields() {
			switch {
			case !f.Exported():
			case f.Embedded():
				fields = append(fields, w.typeString(f.Type()))
			default:
				fields = append(fields, f.Name()+" "+w.typeString(f.Type()))
			}
		}
		if len(fields) == 0 {
			b.WriteString("struct{}")
		} else {
			b.WriteString("struct{ " + strings.Join(fields, "; ") + " }")
		}
	case *types.Interface:
		var elems []string
		for m := range t.ExplicitMethods() {
			elems = append(elems, m.Name()+w.signature(m.Signature()))
		}
		for e := range t.EmbeddedTypes() {
			elems = append(elems, w.typeString(e))
		}
		if len(elems) == 0 {
			b.WriteString("interface{}")
		} else {
			b.WriteString("interface{ " + strings.Join(elems, "; ") + " }")
		}
	case *types.Union:
		for i := range t.Len() {
			if i > 0 {
				b.WriteString(" | ")
			}
			term := t.Term(i)
			if term.Tilde() {
				b.WriteByte('~')
			}
			w.write(b, term.Type())
		}
	default:
		b.WriteString(types.TypeString(t, types.RelativeTo(w.pkg)))
	}
}
