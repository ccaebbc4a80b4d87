package main

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/dupetest"
)

func TestHTTPExample(t *testing.T) {
	var out bytes.Buffer
	s, err := run(t.Context(), filepath.Join(t.TempDir(), "shop.db"), &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Equal(t, []string{"201", "201 replayed", "422", "400", "201"}, s.Statuses)
	require.Equal(t, 2, s.Orders, "alice's lamp once, bob's lamp")
	require.Equal(t, 2, s.Shipments)
}

// The shipping handler behind the inbox ships each order once even when
// every event is delivered again and half of the first attempts fail
// after the handler ran.
func TestHTTPExampleWithDuplicates(t *testing.T) {
	// No late copies: run closes the database when it returns.
	dupes := dupetest.New(dupetest.Config{Seed: 3, Fraction: 1, Late: -1, FailFirst: 0.5})
	s, err := run(t.Context(), filepath.Join(t.TempDir(), "shop.db"), io.Discard, dupes.Middleware)
	require.NoError(t, err)
	dupes.Wait()
	stats := dupes.Stats()
	require.Equal(t, 2, stats.Immediate, "both events were delivered twice")
	require.Empty(t, stats.CopyErrors)
	require.Equal(t, 2, s.Orders)
	require.Equal(t, 2, s.Shipments, "shipped once each")
}
