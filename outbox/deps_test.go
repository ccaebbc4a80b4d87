package outbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDependencies lists, with go list -deps, what the programs in
// testdata/deps link: the MySQL and SQLite programs (inbox, outbox with
// Outputs, relay) link no pgx, and the pgx program (postgres.NewPgxRepository, pgxoutbox)
// does, so the check could fail.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the go command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	for _, tc := range []struct {
		program string
		pgx     bool
	}{
		{"mysql", false},
		{"sqlite", false},
		{"postgres", true},
	} {
		t.Run(tc.program, func(t *testing.T) {
			t.Parallel()
			out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps", "./testdata/deps/"+tc.program).CombinedOutput()
			require.NoError(t, err, "%s", out)
			deps := strings.Fields(string(out))
			var pgx []string
			for _, d := range deps {
				if strings.HasPrefix(d, "github.com/jackc/pgx") {
					pgx = append(pgx, d)
				}
			}
			t.Logf("%s: %d packages, %d of pgx", tc.program, len(deps), len(pgx))
			if tc.pgx {
				require.Contains(t, pgx, "github.com/jackc/pgx/v5")
			} else {
				require.Empty(t, pgx, "a %s program links pgx", tc.program)
			}
		})
	}
}
