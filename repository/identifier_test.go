package repository_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
)

// suffixes are the ones the backends and the outbox derive names with,
// and a long one.
var suffixes = []string{"expires_at_idx", "notify", "dead_letters_created_at_idx", strings.Repeat("s", 60)}

// TestIndexNameAtEveryAcceptedLength checks, for every table-name length
// ValidateTableName accepts, that derived names fit PostgreSQL's 63
// bytes, never equal the table, and differ across suffixes and across
// tables that share a long prefix.
func TestIndexNameAtEveryAcceptedLength(t *testing.T) {
	seen := map[string]string{}
	for n := 1; n <= 63; n++ {
		for _, fill := range []string{"a", "b", "_"} {
			table := "t" + strings.Repeat(fill, n-1)
			if n == 1 && fill != "a" {
				continue
			}
			require.NoError(t, repository.ValidateTableName(table))
			for _, suffix := range suffixes {
				name := repository.IndexName(table, suffix)
				require.LessOrEqual(t, len(name), 63, "%d-byte table, suffix %q", n, suffix)
				require.NotEqual(t, table, name, "%d-byte table, suffix %q", n, suffix)
				require.Equal(t, name, repository.IndexName("schema."+table, suffix), "the schema is dropped")
				require.Equal(t, name, repository.IndexName(table, suffix), "deterministic")
				if n+1+len(suffix) <= 63 {
					require.Equal(t, table+"_"+suffix, name, "names that fit are kept as they are")
				}
				if other, ok := seen[name]; ok {
					t.Fatalf("%q derives %q, like %q", table+"/"+suffix, name, other)
				}
				seen[name] = table + "/" + suffix
			}
		}
	}
}
