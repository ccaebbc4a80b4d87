package mysql

import (
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/watermill-idempotent/repository"
)

// MySQL/MariaDB error numbers that mean a unique key rejected a row.
const (
	errDupEntry            = 1062 // ER_DUP_ENTRY
	errDupEntryWithKeyName = 1586 // ER_DUP_ENTRY_WITH_KEY_NAME
	errDupKey              = 1022 // ER_DUP_KEY
)

func init() {
	// *mysql.MySQLError has no method repository could recognise it by, so
	// importing this package teaches repository.IsUniqueViolation its
	// numbers.
	repository.RegisterUniqueViolation(IsUniqueViolation)
}

// IsUniqueViolation reports whether err, or any error it wraps, is a
// MySQL/MariaDB unique-key violation: error 1062 (ER_DUP_ENTRY), 1586
// (ER_DUP_ENTRY_WITH_KEY_NAME) or 1022 (ER_DUP_KEY), recognised by number,
// never by message. Importing this package registers it with
// repository.IsUniqueViolation, which is what callers normally use.
func IsUniqueViolation(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case errDupEntry, errDupEntryWithKeyName, errDupKey:
		return true
	}
	return false
}
