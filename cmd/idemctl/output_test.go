package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func TestCount(t *testing.T) {
	require.Equal(t, "0 records", count(0, "record"))
	require.Equal(t, "1 record", count(1, "record"))
	require.Equal(t, "2 records", count(2, "record"))
	require.Equal(t, "1 dead letter", count(1, "dead letter"))
}

// Output says "1 record" and "2 records", "1 attempt" and "2 attempts".
func TestPluralsInOutput(t *testing.T) {
	for _, n := range []int{1, 2} {
		path := filepath.Join(t.TempDir(), "inbox.db")
		env := []string{"IDEMCTL_DSN=sqlite://" + path}
		r := idemctl(t, env, "", "migrate", "up")
		require.Equal(t, 0, r.code, r.stderr)
		db, err := sqlite.Open(path)
		require.NoError(t, err)
		repo, err := sqlite.NewRepository(db, sqlite.Config{})
		require.NoError(t, err)
		now := time.Now()
		for i := range n {
			_, err = repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "billing", Key: "old" + string(rune('a'+i)), PayloadHash: repository.HashPayload([]byte("p")),
				Owner: "o", Now: now.Add(-2 * time.Hour), LeaseUntil: now.Add(-2 * time.Hour).Add(time.Second), ExpiresAt: now.Add(-time.Hour)})
			require.NoError(t, err)
		}
		// The stuck record has had n attempts: each reclaim is one more.
		leaveStuck(t, repo, "k1")
		for range n - 1 {
			_, err = repo.Reclaim(t.Context(), repository.ReclaimParams{Consumer: "billing", Key: "k1", PrevOwner: "dead-owner",
				Owner: "second-owner", Now: now.Add(-20 * time.Second), LeaseUntil: now.Add(-10 * time.Second)})
			require.NoError(t, err)
		}
		require.NoError(t, db.Close())

		r = idemctl(t, env, "", "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--release", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		want := map[int]string{1: ", 1 attempt,", 2: ", 2 attempts,"}[n]
		require.Contains(t, r.stderr, want)

		r = idemctl(t, env, "", "purge", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		if n == 1 {
			require.Contains(t, r.stderr, ": 1 record expired before")
			require.Contains(t, r.stdout, "deleted 1 expired record in")
		} else {
			require.Contains(t, r.stderr, ": 2 records expired before")
			require.Contains(t, r.stdout, "deleted 2 expired records in")
		}
	}
}
