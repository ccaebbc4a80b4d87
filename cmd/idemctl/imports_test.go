package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	libraryModule  = "github.com/idemkit/watermill-idempotent"
	idemctlModule  = libraryModule + "/cmd/idemctl"
	libraryPrivate = libraryModule + "/internal"
)

// idemctl is built from a published version of the library (go install
// …/cmd/idemctl@version picks the library's version by minimal version
// selection), so it may use only what the library promises to keep: its
// public API. The go command would build an import of the library's
// internal packages (the rule is by import path, and idemctl's path is
// under the library's), but those change in any release without notice.
// It asks the go command for every package of the module with its test
// variants, so _test.go files count too; the library's own packages may
// use their internal ones, which are published with them.
func TestNoLibraryInternalImports(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: go list loads the module's whole build graph")
	}
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-deps", "-test",
		"-json=ImportPath,Module,Imports,TestImports,XTestImports,Error", "./...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())

	var own []string
	var offending []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath                         string
			Module                             *struct{ Path string }
			Imports, TestImports, XTestImports []string
			Error                              *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		if p.Module == nil || p.Module.Path != idemctlModule {
			continue
		}
		require.Nil(t, p.Error, "go list %s", p.ImportPath)
		own = append(own, p.ImportPath)
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if imp == libraryPrivate || strings.HasPrefix(imp, libraryPrivate+"/") {
				offending = append(offending, p.ImportPath+" imports "+imp)
			}
		}
	}
	// The listing must have found idemctl itself and its test variant, or
	// the check above checked nothing.
	require.Contains(t, own, idemctlModule)
	require.Contains(t, own, idemctlModule+" ["+idemctlModule+".test]")
	slices.Sort(offending)
	if offending = slices.Compact(offending); len(offending) > 0 {
		t.Fatalf("idemctl must build from a published library: use its public packages, not %s/…:\n%s",
			libraryPrivate, strings.Join(offending, "\n"))
	}
}
