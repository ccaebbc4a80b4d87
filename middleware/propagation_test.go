package middleware_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
)

func TestDeriveIsStableAndDistinct(t *testing.T) {
	a := idempotency.Derive("order-1", "charge-card")
	require.Equal(t, a, idempotency.Derive("order-1", "charge-card"), "stable across calls")
	_, err := uuid.Parse(a)
	require.NoError(t, err, "a UUID, accepted by APIs that limit key formats")
	require.NotEqual(t, a, idempotency.Derive("order-1", "send-email"))
	require.NotEqual(t, a, idempotency.Derive("order-2", "charge-card"))
	require.NotEqual(t, idempotency.Derive("a:b", "c"), idempotency.Derive("a", "b:c"))
	// A pinned value: changing the derivation would break every stored
	// downstream key, so it must not change silently.
	require.Equal(t, "29a1c490-3ca3-58c1-a0ed-6e55474649fb", a)
	require.Equal(t, "dc9f93a8-af80-57d4-831c-5a6313d2cbe8", middleware.OutputUUID("billing", "k", 0))

	require.Equal(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("billing", "k", 0))
	require.NotEqual(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("billing", "k", 1))
	require.NotEqual(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("shipping", "k", 0))
}
