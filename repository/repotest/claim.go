package repotest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

func runClaim(t *testing.T, b Backend) {
	runCase(t, b, "FreshClaim", func(t *testing.T, f *fixture) {
		p := ClaimParams("billing", "order-1")

		c := f.claim(t, p, nil)
		require.True(t, c.Claimed)
		require.Zero(t, c.Existing)

		rec := f.get(t, "billing", "order-1")
		requireFirstRecord(t, p, rec)
		require.Equal(t, repository.StateCompleted, rec.State)
		requireTime(t, p.Now, rec.CompletedAt, "CompletedAt")
	})

	runCase(t, b, "DuplicateClaimReturnsStoredRecord", func(t *testing.T, f *fixture) {
		first := ClaimParams("billing", "order-1")
		require.True(t, f.claim(t, first, []byte("result-1")).Claimed)

		second := ClaimParams("billing", "order-1")
		second.PayloadHash = repository.HashPayload([]byte("other content"))
		c := f.claim(t, second, []byte("must not be stored"))
		require.False(t, c.Claimed)
		require.Equal(t, repository.StateCompleted, c.Existing.State)
		require.Equal(t, first.PayloadHash, c.Existing.PayloadHash, "the duplicate must see the first claim's hash")
		require.Equal(t, []byte("result-1"), c.Existing.Result)
		require.Equal(t, "order-1", c.Existing.Key)
	})

	runCase(t, b, "RedeliveryWithLaterExpiryIsDuplicate", func(t *testing.T, f *fixture) {
		// A redelivery computes its expiry from its own claim time, days
		// later: a store whose uniqueness depends on the expiry (a table
		// partitioned by it) must still find the first record.
		const retention = 7 * 24 * time.Hour
		first := ClaimParams("billing", "order-1")
		first.ExpiresAt = first.Now.Add(retention)
		require.True(t, f.claim(t, first, []byte("result-1")).Claimed)

		// Two days later, within the first record's retention.
		later := ClaimParams("billing", "order-1")
		later.Now = first.Now.Add(49 * time.Hour)
		later.ExpiresAt = later.Now.Add(retention)
		c := f.claim(t, later, []byte("must not be stored"))
		require.False(t, c.Claimed, "a redelivery with a later expiry is a duplicate")
		require.Equal(t, []byte("result-1"), c.Existing.Result)
		require.True(t, first.ExpiresAt.Equal(c.Existing.ExpiresAt), "the first record's expiry stays: %s", c.Existing.ExpiresAt)
	})

	runCase(t, b, "RolledBackClaimLeavesNothing", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		p := ClaimParams("billing", "order-1")

		tx := f.claimOpen(t, p)
		require.NoError(t, f.tx.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: "billing", Key: "order-1", Result: []byte("x")}))
		require.NoError(t, tx.Rollback())

		_, err := f.repo.Get(ctx, "billing", "order-1")
		require.ErrorIs(t, err, repository.ErrNotFound)
		require.True(t, f.claim(t, p, nil).Claimed, "the claim after a rollback must win")
	})

	runCase(t, b, "SameKeyUnderTwoConsumersIsTwoRecords", func(t *testing.T, f *fixture) {
		require.True(t, f.claim(t, ClaimParams("billing", "order-1"), []byte("b")).Claimed)
		require.True(t, f.claim(t, ClaimParams("shipping", "order-1"), []byte("s")).Claimed)

		billing, err := f.repo.Get(t.Context(), "billing", "order-1")
		require.NoError(t, err)
		shipping, err := f.repo.Get(t.Context(), "shipping", "order-1")
		require.NoError(t, err)
		require.Equal(t, []byte("b"), billing.Result)
		require.Equal(t, []byte("s"), shipping.Result)
		require.False(t, f.claim(t, ClaimParams("billing", "order-1"), nil).Claimed)
		require.False(t, f.claim(t, ClaimParams("shipping", "order-1"), nil).Claimed)
	})

	runCase(t, b, "KeysAreCaseSensitive", func(t *testing.T, f *fixture) {
		require.True(t, f.claim(t, ClaimParams("billing", "Order-1"), []byte("upper")).Claimed)
		require.True(t, f.claim(t, ClaimParams("billing", "order-1"), []byte("lower")).Claimed,
			"keys differing only in case must be two records")
		require.True(t, f.claim(t, ClaimParams("Billing", "order-1"), []byte("consumer")).Claimed,
			"consumers differing only in case must be two records")

		upper, err := f.repo.Get(t.Context(), "billing", "Order-1")
		require.NoError(t, err)
		require.Equal(t, "Order-1", upper.Key)
		require.Equal(t, []byte("upper"), upper.Result)
		lower, err := f.repo.Get(t.Context(), "billing", "order-1")
		require.NoError(t, err)
		require.Equal(t, "order-1", lower.Key)
		require.Equal(t, []byte("lower"), lower.Result)
		require.False(t, f.claim(t, ClaimParams("billing", "Order-1"), nil).Claimed)
	})

	runCase(t, b, "LongKeyIsHashedNotTruncated", func(t *testing.T, f *fixture) {
		prefix := strings.Repeat("k", repository.MaxKeyLength)
		long1, long2 := prefix+"-one", prefix+"-two"
		huge := strings.Repeat("x", 10_000)

		for _, key := range []string{long1, long2, huge} {
			require.True(t, f.claim(t, ClaimParams("billing", key), []byte(key[len(key)-4:])).Claimed,
				"long keys sharing a %d-byte prefix must not collide", repository.MaxKeyLength)
		}
		rec, err := f.repo.Get(t.Context(), "billing", long2)
		require.NoError(t, err)
		require.Equal(t, repository.StorageKey(long2), rec.Key)
		require.LessOrEqual(t, len(rec.Key), repository.MaxKeyLength)
		require.Equal(t, []byte("-two"), rec.Result)
		require.False(t, f.claim(t, ClaimParams("billing", long1), nil).Claimed, "the same long key again is a duplicate")

		// A short key spelled like a hashed one cannot collide with it.
		require.True(t, f.claim(t, ClaimParams("billing", repository.StorageKey(long1)), nil).Claimed)
		// Exactly MaxKeyLength bytes is stored as is.
		exact := strings.Repeat("e", repository.MaxKeyLength)
		require.True(t, f.claim(t, ClaimParams("billing", exact), nil).Claimed)
		rec, err = f.repo.Get(t.Context(), "billing", exact)
		require.NoError(t, err)
		require.Equal(t, exact, rec.Key)
	})

	runCase(t, b, "UnstorableKeysAreStoredSafely", func(t *testing.T, f *fixture) {
		for _, k := range unstorable {
			require.True(t, f.claim(t, ClaimParams("billing", k.value), []byte(k.name)).Claimed, k.name)
			rec, err := f.repo.Get(t.Context(), "billing", k.value)
			require.NoError(t, err, k.name)
			requireStoredForm(t, k.value, rec.Key)
			require.Equal(t, []byte(k.name), rec.Result, k.name)

			again := f.claim(t, ClaimParams("billing", k.value), nil)
			require.False(t, again.Claimed, "%s: the redelivery is a duplicate", k.name)
			require.Equal(t, []byte(k.name), again.Existing.Result, k.name)
		}
		// The key with its NUL byte removed is another key.
		require.True(t, f.claim(t, ClaimParams("billing", "order-1"), nil).Claimed)
	})

	runCase(t, b, "PayloadHashAndResultRoundTrip", func(t *testing.T, f *fixture) {
		p := ClaimParams("billing", "order-1")
		p.PayloadHash = repository.HashPayload([]byte{0, 1, 2, 0xff})
		result := []byte{0, 0xff, 0xfe, '\n', 0, 'x'}
		require.True(t, f.claim(t, p, result).Claimed)

		c := f.claim(t, p, nil)
		require.False(t, c.Claimed)
		require.Equal(t, p.PayloadHash, c.Existing.PayloadHash)
		require.Equal(t, result, c.Existing.Result)
	})

	runCase(t, b, "SaveResultWithoutClaimIsNotFound", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		tx := f.beginTx(t)
		err := f.tx.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: "billing", Key: "never-claimed", Result: []byte("x")})
		require.ErrorIs(t, err, repository.ErrNotFound)
	})

	runCase(t, b, "InvalidParamsAreRefused", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		tx := f.beginTx(t)

		valid := ClaimParams("billing", "k")
		for name, mutate := range map[string]func(*repository.ClaimParams){
			"empty key":           func(p *repository.ClaimParams) { p.Key = "" },
			"empty consumer":      func(p *repository.ClaimParams) { p.Consumer = "" },
			"zero now":            func(p *repository.ClaimParams) { p.Now = time.Time{} },
			"expiry before now":   func(p *repository.ClaimParams) { p.ExpiresAt = p.Now.Add(-time.Second) },
			"expiry equal to now": func(p *repository.ClaimParams) { p.ExpiresAt = p.Now },
		} {
			p := valid
			mutate(&p)
			_, err := claimOne(ctx, f.tx, tx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, name)
		}
		for name, consumer := range invalidConsumers {
			p := valid
			p.Consumer = consumer
			_, err := claimOne(ctx, f.tx, tx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, "claim: %s", name)
			err = f.tx.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: consumer, Key: "k"})
			require.ErrorIs(t, err, repository.ErrInvalidParams, "save result: %s", name)
			_, err = f.repo.Get(ctx, consumer, "k")
			require.ErrorIs(t, err, repository.ErrInvalidParams, "get: %s", name)
		}
		_, err := f.repo.Get(ctx, "billing", "")
		require.ErrorIs(t, err, repository.ErrInvalidParams)
	})
}
