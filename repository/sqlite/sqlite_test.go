package sqlite_test

import (
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/sqlstoretest"
)

func TestConformance(t *testing.T)     { sqlstoretest.Run(t, sqlstoretest.SQLite(t)) }
func BenchmarkRepository(b *testing.B) { sqlstoretest.Bench(b, sqlstoretest.SQLite(b)) }
