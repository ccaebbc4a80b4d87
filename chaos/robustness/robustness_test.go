package robustness

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// short is the short profile for tests: the cells of make chaos-ci,
// shortened where a test runs one fault after another.
func short(t *testing.T) Profile {
	p := Short()
	p.Duration = 3 * time.Second
	p.FaultEvery = time.Second
	p.VisualizeDir = t.TempDir()
	return p
}

func TestBrokenStoreIsCaught(t *testing.T) {
	b, err := OpenBackend(t.Context(), "broken")
	require.NoError(t, err)
	t.Cleanup(b.Close)
	r := RunCell(t.Context(), short(t), b, b.Faults[0])
	require.NoError(t, r.Err)
	t.Logf("%d ops, %d keys, %d anomalies; the failing history: %s", r.Ops, r.Keys, r.Anomalies, r.Visualization)
	require.Positive(t, r.Anomalies, "the check-then-set store passed the check: the suite cannot fail")
	require.FileExists(t, r.Visualization)
}

func TestRealStoresAreLinearizable(t *testing.T) {
	for _, name := range BackendNames {
		t.Run(name, func(t *testing.T) {
			if private(name) && (testing.Short() || raceDetector) {
				t.Skip("skipping a private server's cells under -short and -race: make chaos-ci runs them (go run ./chaos/cmd/chaos -config robust)")
			}
			b, err := OpenBackend(t.Context(), name)
			if errors.Is(err, ErrMissing) {
				if os.Getenv("CI") == "true" {
					t.Fatalf("%v (CI=true requires it)", err)
				}
				t.Skipf("skipping: %v (start it, or set CI=true to make this a failure)", err)
			}
			require.NoError(t, err)
			t.Cleanup(b.Close)
			for _, f := range b.Faults {
				if expected(name, f) != "" {
					continue // counted by the profile, not a failure
				}
				t.Run(f.Name, func(t *testing.T) {
					p := short(t)
					r := RunCell(t.Context(), p, b, f)
					require.NoError(t, r.Err)
					t.Logf("%d ops (%d unknown), %d keys, %d faults injected", r.Ops, r.Unknown, r.Keys, r.Injected)
					require.Positive(t, r.Ops)
					require.Zero(t, r.Undecided, "keys the checker could not decide")
					require.Zero(t, r.Anomalies, "not linearizable; the failing history: %s", filepath.Base(r.Visualization))
				})
			}
		})
	}
}

// private reports whether backend name runs on a server of its own.
func private(name string) bool { return name == "postgres" || strings.HasPrefix(name, "redis") }
