package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// TestRun runs the migration as `go run ./examples/migrate-deduplicator`
// does, against the real PostgreSQL in a schema of its own, and checks
// each phase's ledger: the Deduplicator loses the order whose handler
// failed past the retry budget (before, prepare); its in-memory keys do
// not survive the first deployment (the copies of p1's orders are charged
// again, as at any restart of the old service); from then on no copy is
// charged twice across a deployment — the inbox finds the keys the
// prepared Deduplicator stored, then legacyKey finds the window's keys
// after the key changed to the UUID — and nothing is lost.
func TestRun(t *testing.T) {
	out := runMigration(t, true)
	require.Regexp(t, `^before   \(Deduplicator: Adler-32 of the payload, in memory\)
  6 deliveries of 4 orders: charged once \[p1-o1 p1-o2 p1-o3\], more than once \[\], never \[p1-o4\]
prepare  \(Deduplicator: SHA-256 of the payload, in the inbox table\)
  8 deliveries of 6 orders: charged once \[p2-o1 p2-o2 p2-o3\], more than once \[p1-o2 p1-o3\], never \[p2-o4\]
window   \(inbox: key = the same SHA-256 of the payload\)
  8 deliveries of 6 orders: charged once \[p2-o2 p2-o3 p3-o1 p3-o2 p3-o3 p3-o4\], more than once \[\], never \[\]
after    \(inbox: key = the UUID, the SHA-256 claimed too\)
  8 deliveries of 6 orders: charged once \[p3-o2 p3-o3 p4-o1 p4-o2 p4-o3 p4-o4\], more than once \[\], never \[\]
$`, out)
}

// TestRunWithoutLegacyKey switches the key to the UUID without legacyKey:
// the window's copies arrive with keys the inbox has never seen (p3-o2's
// copy under a new UUID, p3-o3's under a UUID stored only as a payload
// hash) and are charged again; so is p4-o2, re-sent by its producer under
// a new UUID — which is why the UUID key needs producers that re-send
// under the same UUID (or a business key) before legacyKey goes.
func TestRunWithoutLegacyKey(t *testing.T) {
	out := runMigration(t, false)
	require.Regexp(t, `(?m)^after .*\n  8 deliveries of 6 orders: charged once \[p4-o1 p4-o3 p4-o4\], more than once \[p3-o2 p3-o3 p4-o2\], never \[\]$`, out)
}

func runMigration(t *testing.T, legacy bool) string {
	dsn := testenv.PostgresSchemaDSN(t, "exmigrate_")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a deadline for a stuck run
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, dsn, &out, legacy)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	return out.String()
}
