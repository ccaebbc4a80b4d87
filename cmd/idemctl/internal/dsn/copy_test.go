package dsn_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// This package is a copy of the library's internal/dsn: idemctl builds
// from a published library, whose internal packages it does not use. A
// fix to either copy (a secret that leaked) belongs in both, so in the
// repository, where the library's copy sits beside, the two must match.
func TestSameAsTheLibrarysCopy(t *testing.T) {
	library, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "internal", "dsn", "dsn.go"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("the library's source is not beside this module (a module download)")
	}
	require.NoError(t, err)
	ours, err := os.ReadFile("dsn.go")
	require.NoError(t, err)
	require.Equal(t, string(library), string(ours), "cmd/idemctl/internal/dsn/dsn.go and internal/dsn/dsn.go differ: make the same change in both")
}
