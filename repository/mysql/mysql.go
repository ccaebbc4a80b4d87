package mysql

import (
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, for the default table names: Migrate applies them, and so can
// golang-migrate (one folder per migrations table; its DSN needs
// multiStatements=true).
//
//go:embed migrations
var Migrations embed.FS

// MaxPayloadHashLength is the longest payload hash, in bytes, that the
// payload_hash column holds. A SHA-256 (repository.HashPayload) is 32.
const MaxPayloadHashLength = 255

var dialect = &sqlstore.Dialect{
	Name: "mysql", Quote: "`", Bind: sqlstore.Question, Migrations: Migrations,
	// The session lock every migration line takes, the outbox's too.
	MigrateLock:   sqlstore.MySQLMigrateLock,
	MigrateUnlock: sqlstore.MySQLMigrateUnlock,
	IsApplied:     func(err error) bool { return hasNumber(err, 1050, 1061) }, // table, index exists
	// Sees the latest committed row, not the REPEATABLE READ snapshot;
	// MySQL 8 and every MariaDB understand LOCK IN SHARE MODE.
	LockingRead: ` LOCK IN SHARE MODE`,
	ChangedRows: true,
	PickExpired: `SELECT consumer, dedup_key FROM {T} WHERE expires_at < $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED`,
	DeleteByKeys: func(n int) string {
		return `DELETE x FROM (SELECT ? AS consumer, ? AS dedup_key` + strings.Repeat(` UNION ALL SELECT ?, ?`, n-1) +
			`) AS d STRAIGHT_JOIN {T} AS x ON x.consumer = d.consumer AND x.dedup_key = d.dedup_key`
	},
	// The first statement creates the row at "nothing applied"
	// (math.MinInt64, refused as a version) or changes nothing, and locks
	// it either way. In the second a matched row is a changed row, so its
	// count is exact whatever the DSN's clientFoundRows says.
	Advance: []string{
		`INSERT INTO {T} (consumer, entity, version) VALUES ($1, $2, -9223372036854775808) ON DUPLICATE KEY UPDATE version = version`,
		`UPDATE {T} SET version = $3 WHERE consumer = $1 AND entity = $2 AND version < $3`,
	},
	MaxPayloadHash:    MaxPayloadHashLength,
	EncodeTime:        encodeTime,
	DecodeTime:        decodeTime,
	IsUniqueViolation: IsUniqueViolation,
	IsRetryable:       func(err error) bool { return hasNumber(err, 1213) }, // ER_LOCK_DEADLOCK
}

type (
	// Config configures a Repository: Table is the inbox table, optionally
	// database-qualified, default repository.DefaultTableName.
	Config = sqlstore.Config
	// VersionConfig configures a VersionStore: Table defaults to
	// repository.DefaultVersionsTableName.
	VersionConfig = sqlstore.Config
	// Repository stores inbox records in MySQL or MariaDB (InnoDB). It
	// implements repository.Transactional, BatchTransactional, TwoPhase,
	// Reader, Cleaner, Operator and Stats and is safe for concurrent use.
	// Every value is checked to fit its column before it is sent (keys and
	// consumers of at most 255 bytes, payload hashes of at most
	// MaxPayloadHashLength, times in years 1000 to 9999), so none is ever
	// truncated, even under a non-strict sql_mode.
	Repository = sqlstore.Inbox
	// VersionStore keeps the last applied version per (consumer, entity)
	// in MySQL or MariaDB (InnoDB), with two statements (see dialect).
	VersionStore = sqlstore.Versions
)

// NewRepository returns a Repository over db; any DSN works. It does not
// create the schema: call Migrate, or apply Migrations with your
// migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, sqlstore.StdDB(db), config)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, sqlstore.StdDB(db), config)
}

// init teaches repository.IsUniqueViolation and IsDataException
// *mysql.MySQLError, which has no method they could recognise it by.
func init() {
	repository.RegisterUniqueViolation(IsUniqueViolation)
	repository.RegisterDataException(IsDataException)
}

// IsUniqueViolation reports whether err, or any error it wraps, is a
// MySQL/MariaDB unique-key violation, by number: 1062 (ER_DUP_ENTRY), 1586
// (ER_DUP_ENTRY_WITH_KEY_NAME) or 1022 (ER_DUP_KEY). It is the one list
// the repository uses; importing this package registers it.
func IsUniqueViolation(err error) bool { return hasNumber(err, 1062, 1586, 1022) }

// IsDataException reports whether err, or any error it wraps, is a
// MySQL/MariaDB error about a value of the statement, by code: SQLSTATE
// class 22 (1406 data too long, 1264 out of range, 1292 incorrect
// datetime, …), 1366 or 1300 (bad value or character string, reported
// under HY000). Importing this package registers it.
func IsDataException(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.SQLState[0] == '2' && me.SQLState[1] == '2' || hasNumber(err, 1366, 1300)
}

func hasNumber(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
}

// DATETIME holds years 1000 to 9999; the layout is what MySQL prints for
// DATETIME(6), so strings compare like the times they spell.
const datetimeLayout = "2006-01-02 15:04:05.000000"

// encodeTime formats t in UTC for a DATETIME(6) column, truncated to the
// microsecond. Sending the text ourselves (the driver would send text too,
// in the DSN's loc) keeps stored values UTC whatever the DSN says.
func encodeTime(t time.Time) (any, error) {
	u := t.UTC()
	if u.Year() < 1000 || u.Year() > 9999 {
		return "", fmt.Errorf("%w: %s is outside the DATETIME range (years 1000 to 9999)", repository.ErrInvalidParams, t)
	}
	return u.Format(datetimeLayout), nil
}

// decodeTime reads a DATETIME written by encodeTime as UTC, whether the
// driver hands it over as text (parseTime=false) or as a time.Time in the
// DSN's loc (parseTime=true), whose wall clock is the stored UTC value.
func decodeTime(v any) (time.Time, error) {
	switch v := v.(type) {
	case time.Time:
		return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC), nil
	case []byte:
		return time.ParseInLocation("2006-01-02 15:04:05.999999999", string(v), time.UTC)
	}
	return time.Time{}, fmt.Errorf("mysql: cannot scan %T into a timestamp", v)
}
