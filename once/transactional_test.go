package once_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/once"
)

// ledger is a business table without a unique constraint, so a second
// run of fn would show as a second row.
func ledger(t *testing.T, s *backends.Store) string {
	table := backends.RandomName("ledger")
	_, err := s.DB.Exec(`CREATE TABLE ` + table + ` (job TEXT NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = s.DB.Exec(`DROP TABLE IF EXISTS ` + table) })
	return table
}

func rows(t *testing.T, s *backends.Store, table string) int {
	var n int
	require.NoError(t, s.DB.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

func insert(table string) once.TxFunc[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		key, _ := once.KeyFromContext(ctx)
		_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (job) VALUES ('`+key+`')`)
		return []byte("row for " + key), err
	}
}

func newTransactional(t *testing.T, s *backends.Store) *once.Transactional[*sql.Tx] {
	o, err := once.NewTransactional(s.SQL, once.Config{Scope: backends.RandomName("etl")})
	require.NoError(t, err)
	return o
}

func TestTransactionalRunsOnceAndReplays(t *testing.T) {
	backends.ForEach(t, backends.SQLNames, func(t *testing.T, s *backends.Store) {
		table := ledger(t, s)
		o := newTransactional(t, s)

		res, err := o.DoInput(t.Context(), "step-1", []byte("batch 1"), insert(table))
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("row for step-1")}, res)

		res, err = o.DoInput(t.Context(), "step-1", []byte("batch 1"), insert(table))
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("row for step-1"), Replayed: true}, res)
		require.Equal(t, 1, rows(t, s, table))

		_, err = o.DoInput(t.Context(), "step-1", []byte("batch 2"), insert(table))
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.True(t, idempotency.IsPermanent(err))
		require.Equal(t, 1, rows(t, s, table))
	})
}

func TestTransactionalFailureRollsBackTogether(t *testing.T) {
	backends.ForEach(t, backends.SQLNames, func(t *testing.T, s *backends.Store) {
		table := ledger(t, s)
		o := newTransactional(t, s)
		boom := errors.New("boom")
		_, err := o.Do(t.Context(), "k", func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			if _, err := insert(table)(ctx, tx); err != nil {
				return nil, err
			}
			return nil, boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, 0, rows(t, s, table), "the write rolled back with the marker")

		require.PanicsWithValue(t, "kaput", func() {
			_, _ = o.Do(t.Context(), "k", func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, _ = insert(table)(ctx, tx)
				panic("kaput")
			})
		})
		require.Equal(t, 0, rows(t, s, table))

		res, err := o.Do(t.Context(), "k", insert(table))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, 1, rows(t, s, table))
	})
}

func TestTransactionalConcurrentCallsRunOnce(t *testing.T) {
	backends.ForEach(t, backends.SQLNames, func(t *testing.T, s *backends.Store) {
		table := ledger(t, s)
		o := newTransactional(t, s)
		const callers = 32
		var runs atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]once.Result, callers)
		errs := make([]error, callers)
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = o.Do(context.Background(), "shared", func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
					runs.Add(1)
					return insert(table)(ctx, tx)
				})
			}()
		}
		close(start)
		wg.Wait()
		fresh := 0
		for i := range callers {
			require.NoError(t, errs[i], "a concurrent call waits for the first transaction, then replays")
			require.Equal(t, []byte("row for shared"), results[i].Value)
			if !results[i].Replayed {
				fresh++
			}
		}
		require.Equal(t, 1, fresh)
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, rows(t, s, table))
	})
}

func TestConfigValidate(t *testing.T) {
	_, err := once.NewTwoPhase(once.TwoPhaseConfig{})
	require.ErrorContains(t, err, "missing Config.Repository")
	require.ErrorContains(t, err, "missing Config.Scope")
	_, err = once.NewTransactional[*sql.Tx](nil, once.Config{Scope: "a\x00b"})
	require.ErrorContains(t, err, "needs a repository.Driver")
	require.ErrorContains(t, err, "NUL byte")
}
