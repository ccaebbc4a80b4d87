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
	// importing this package teaches repository.IsUniqueViolation and
	// repository.IsDataException its numbers.
	repository.RegisterUniqueViolation(IsUniqueViolation)
	repository.RegisterDataException(IsDataException)
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

// MySQL/MariaDB data errors reported under the generic SQLSTATE HY000 by
// MySQL (MariaDB reports them under class 22).
const (
	errTruncatedWrongValueForField = 1366 // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: incorrect string or integer value
	errInvalidCharacterString      = 1300 // ER_INVALID_CHARACTER_STRING
)

// IsDataException reports whether err, or any error it wraps, is a
// MySQL/MariaDB error about a value of the statement: SQLSTATE class 22
// (1406 data too long, 1264 out of range, 1292 incorrect datetime, 1365
// division by zero, …) or error 1366 or 1300, recognised by code, never
// by message. Importing this package registers it with
// repository.IsDataException.
func IsDataException(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	if me.SQLState[0] == '2' && me.SQLState[1] == '2' {
		return true
	}
	return me.Number == errTruncatedWrongValueForField || me.Number == errInvalidCharacterString
}
