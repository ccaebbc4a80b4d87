package repository_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestContractsImportNoSQLImplementation checks, from the package's
// imports as go/build reads them, that the storage contracts import
// nothing of the SQL implementation (internal/sqlstore and below).
func TestContractsImportNoSQLImplementation(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/idemkit/watermill-idempotent/internal/sqlstore") {
			t.Errorf("repository imports %s, a piece of the SQL implementation", imp)
		}
	}
}
