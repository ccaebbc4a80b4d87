package postgres_test

import (
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/sqlstoretest"
)

func TestConformance(t *testing.T)     { sqlstoretest.Run(t, sqlstoretest.Postgres(t)) }
func TestConformancePgx(t *testing.T)  { sqlstoretest.Run(t, sqlstoretest.PostgresPgx(t)) }
func BenchmarkRepository(b *testing.B) { sqlstoretest.Bench(b, sqlstoretest.Postgres(b)) }
