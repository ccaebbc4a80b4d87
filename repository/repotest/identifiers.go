package repotest

import (
	"strings"
	"testing"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

func runIdentifiers(t *testing.T, b Backend) {
	t.Run("InvalidTableNameIsRefused", func(t *testing.T) {
		t.Parallel()
		if b.Features.NoSQLTable {
			t.Skipf("%s keeps no SQL table", b.Name)
		}
		for _, name := range []string{
			`inbox; DROP TABLE users`,
			`inbox"--`,
			"inbox`",
			`in box`,
			`1inbox`,
			`a.b.c`,
			`inbox/*x*/`,
			`ünïcode`,
			strings.Repeat("a", 64),
		} {
			repo, err := b.New(t, name)
			require.ErrorIs(t, err, repository.ErrInvalidTableName, "%s accepted table name %q", b.Name, name)
			require.Nil(t, repo)
		}
	})

	runCase(t, b, "SchemaCreationIsIdempotent", func(t *testing.T, f *fixture) {
		again, err := b.New(t, f.table)
		require.NoError(t, err, "second New on the same table")
		_, err = again.Get(t.Context(), "c", "missing")
		require.ErrorIs(t, err, repository.ErrNotFound)
	})
}
