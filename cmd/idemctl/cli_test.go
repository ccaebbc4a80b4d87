package main

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stats counts the expired records purge would delete, per consumer, in
// a column of their own and in JSON whose keys are all snake_case; a
// consumer with only expired records has a line; bare purge deletes them.
func TestStatsCountsExpiredRecords(t *testing.T) {
	dsn, db, repo, table := pgInbox(t)
	insertExpired(t, db, table, "billing", 2500)
	insertExpired(t, db, table, "shipping", 1)
	_, err := db.Exec(`INSERT INTO ` + table + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
		VALUES ('billing', 'live', 'completed', '\x00', 1, now(), now(), now() + interval '1 day')`)
	require.NoError(t, err)
	leaveStuck(t, repo, "stuck")
	env := []string{"IDEMCTL_DSN=" + dsn}

	r := idemctl(t, env, "", "--table", table, "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `CONSUMER\s+IN_PROGRESS\s+STALE\s+COMPLETED\s+EXPIRED\n`, r.stdout)
	require.Regexp(t, `billing\s+0\s+1\s+1\s+2500\n`, r.stdout)
	require.Regexp(t, `shipping\s+0\s+0\s+0\s+1\n`, r.stdout)

	r = idemctl(t, env, "", "--table", table, "--json", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	var raw struct {
		Consumers []map[string]any `json:"consumers"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw), r.stdout)
	require.Len(t, raw.Consumers, 2)
	for _, c := range raw.Consumers {
		require.Equal(t, []string{"completed", "consumer", "expired", "in_progress", "stale"}, slices.Sorted(maps.Keys(c)))
	}
	requireSnakeCase(t, r.stdout)
	var out statsOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, []consumerStats{
		{Consumer: "billing", Stale: 1, Completed: 1, Expired: 2500},
		{Consumer: "shipping", Expired: 1},
	}, out.Consumers)

	r = idemctl(t, env, "", "--table", table, "--json", "stats", "--consumer", "shipping")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, []consumerStats{{Consumer: "shipping", Expired: 1}}, out.Consumers)

	r = idemctl(t, env, "", "--table", table, "purge", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "deleted 2501 expired records")
	r = idemctl(t, env, "", "--table", table, "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `billing\s+0\s+1\s+1\s+0\n`, r.stdout)
	require.NotContains(t, r.stdout, "shipping")
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// requireSnakeCase checks that every key of the JSON document doc, at
// every depth, is snake_case.
func requireSnakeCase(t *testing.T, doc string) {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(doc), &v), doc)
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				require.Regexp(t, snakeCase, k, doc)
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
}

// --version prints the module version (or "(devel)") and the Go version.
func TestVersion(t *testing.T) {
	r := idemctl(t, nil, "", "--version")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^idemctl (\(devel\)|v\d+\.\d+\.\d+\S*) go1\.\d+`, r.stdout)
	require.Empty(t, r.stderr)
	require.Equal(t, version()+"\n", "idemctl "+strings.TrimPrefix(r.stdout, "idemctl "), "one line")
}

// Bare idemctl and a bare command group print their usage; a command's
// help lists its own flags and names the global ones; migrate's help says
// why there is no migrate down.
func TestUsage(t *testing.T) {
	r := idemctl(t, nil, "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stdout, "Usage: idemctl <command>")
	require.Contains(t, r.stdout, "stuck resolve")
	require.Contains(t, r.stderr, "idemctl: expected one of")

	r = idemctl(t, nil, "", "stuck")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stdout, "Usage: idemctl stuck <command>")
	require.Contains(t, r.stdout, "stuck list")

	r = idemctl(t, nil, "", "stats", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "--consumer=STRING")
	require.NotContains(t, r.stdout, "--dsn=", "the global flags' descriptions are idemctl --help's")
	require.Contains(t, r.stdout, "Global flags (idemctl --help describes them): --dsn, --redis,")
	require.Less(t, strings.Count(r.stdout, "\n"), 20, r.stdout)

	r = idemctl(t, nil, "", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "--dsn=DSN")
	require.Contains(t, r.stdout, "--version")

	for _, args := range [][]string{{"migrate", "--help"}, {"migrate", "up", "--help"}} {
		r = idemctl(t, nil, "", args...)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, `There is no "migrate down", on purpose.`, "%v", args)
		require.Contains(t, r.stdout, "the duplicate effect", "%v", args)
	}
	r = idemctl(t, nil, "", "migrate", "down")
	require.Equal(t, 2, r.code)
}
