package main

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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
