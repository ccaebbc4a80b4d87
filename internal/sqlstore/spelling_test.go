package sqlstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// migrating is a store with versioned migrations.
type migrating interface {
	Migrations(context.Context) ([]sqlstore.Migration, error)
}

// TestMigrateSpellingsOfOneTable runs Migrate eight times at once, half
// naming the table "t" under search_path s, half "s.t": the migration
// lock is one constant for every table, and the record's subject and
// migrations table follow the table, not its spelling, so each migration
// is applied once in all and no run fails. (Before, every runner that
// found the table missing before it took the lock voided the records of
// the runners before it and ran every file again.)
func TestMigrateSpellingsOfOneTable(t *testing.T) {
	db, schema := testenv.PostgresSchema(t, "migsp_")
	lines := map[string][]int{"inbox": {1, 2}, "partitioned inbox": {1}}
	for name, open := range map[string]func(table string) (migrating, error){
		"inbox": func(table string) (migrating, error) {
			return postgres.NewRepository(db, postgres.Config{Table: table})
		},
		"partitioned inbox": func(table string) (migrating, error) {
			return postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table})
		},
	} {
		t.Run(name, func(t *testing.T) {
			table := randomName("sp")
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				applied []int
				errs    []error
			)
			for i := range 8 {
				spelling := table
				if i%2 == 1 {
					spelling = schema + "." + table
				}
				repo, err := open(spelling)
				require.NoError(t, err)
				wg.Go(func() {
					ms, err := repo.Migrations(t.Context())
					mu.Lock()
					defer mu.Unlock()
					applied = append(applied, versionsOf(ms)...)
					if err != nil {
						errs = append(errs, err)
					}
				})
			}
			wg.Wait()
			require.Empty(t, errs)
			slices.Sort(applied)
			require.Equal(t, lines[name], applied, "each migration applied once in all")
		})
	}
}

// randomName is prefix plus random hex: a table name of the test's own.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// versionsOf lists the versions of ms, in order.
func versionsOf(ms []sqlstore.Migration) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Version)
	}
	return out
}
