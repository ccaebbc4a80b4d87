// Package copied checks that the examples meant to be copied into a
// service build outside this repository's modules.
package copied

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const library = "github.com/idemkit/watermill-idempotent"

// TestExamplesBuildWhenCopied copies each example's directory, without its
// tests (they use the repository's internal/testsupport/testenv), into a new module
// in a temporary directory, as a reader does: go mod init, a requirement
// on the library replaced by this checkout, go mod tidy, go build and
// go vet, outside the workspace (GOWORK=off). The examples module's
// requirements, indirect ones included, are added first as minimum
// versions, so tidy chooses the versions the examples are tested with
// (kfake needs a newer franz-go than its go.mod asks for) and needs the
// network only for what the module cache lacks; tidy drops those the
// example does not import. It fails if an example imports a package of
// this repository other than the library's public ones.
func TestExamplesBuildWhenCopied(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go mod tidy, go build and go vet on three copies")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("../../..") // the library module
	require.NoError(t, err)
	examples := filepath.Join(root, "examples")
	floors := requirements(t, goCmd, examples)

	for _, example := range []string{"rabbitmq", "kafka", "router"} {
		t.Run(example, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, filepath.Join(examples, example), dir)
			gosum, err := os.ReadFile(filepath.Join(examples, "go.sum"))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), gosum, 0o644))

			edit := []string{"mod", "edit", "-go=" + floors.Go,
				"-require=" + library + "@v0.0.0-00010101000000-000000000000",
				"-replace=" + library + "=" + root}
			for _, r := range floors.Require {
				if !strings.HasPrefix(r.Path, library) {
					edit = append(edit, "-require="+r.Path+"@"+r.Version)
				}
			}
			for _, args := range [][]string{
				{"mod", "init", "example.com/" + example},
				edit,
				{"mod", "tidy"},
				{"build", "./..."},
				{"vet", "./..."},
			} {
				cmd := exec.CommandContext(t.Context(), goCmd, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "go %s in a copy of examples/%s:\n%s", args[0]+" "+args[1], example, out)
			}
			t.Logf("examples/%s builds and vets as module example.com/%s, requiring %s",
				example, example, strings.Join(directRequirements(t, goCmd, dir), ", "))
		})
	}
}

type goMod struct {
	Go      string
	Require []struct {
		Path, Version string
		Indirect      bool
	}
}

// requirements reads the go.mod in dir.
func requirements(t *testing.T, goCmd, dir string) goMod {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), goCmd, "mod", "edit", "-json")
	cmd.Dir = dir
	out, err := cmd.Output()
	require.NoError(t, err)
	var m goMod
	require.NoError(t, json.Unmarshal(out, &m))
	return m
}

// directRequirements lists the modules the go.mod in dir requires directly.
func directRequirements(t *testing.T, goCmd, dir string) []string {
	t.Helper()
	var direct []string
	for _, r := range requirements(t, goCmd, dir).Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	return direct
}

// copyDir copies the regular files of src, but its tests, into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
}
