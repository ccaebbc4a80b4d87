// Package sqlstore is the one SQL implementation of the storage contracts
// (repository.Driver's claims, TwoPhase, Reader, Cleaner, Operator, Stats,
// VersionGuard), of the outbox's statements and of versioned migrations.
//
// Each database's SQL is on one page: postgres.go, mysql.go and sqlite.go
// each hold a Dialect with every statement the inbox, the two-phase
// store, the version store, the outbox and the migrations send, written
// out whole with {T} for the quoted table and the driver's own
// placeholders ($1 on PostgreSQL, ?1 on SQLite, ? on MySQL), beside the
// few real differences (RETURNING, changed rows, locking reads, error
// codes, the migration lock). The code of this package runs them and
// never glues SQL together.
package sqlstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Bind is how a driver writes placeholders.
type Bind int

const (
	Dollar           Bind = iota // $1, $2 (PostgreSQL)
	QuestionNumbered             // ?1, ?2 (SQLite)
	Question                     // ?, ? in order, an argument per use (MySQL)
)

// SQL is one complete statement of a page. Text has {T} for the quoted
// table ({D}: the outbox's dead-letter table) and the driver's
// placeholders. $n and ?n name the operation's n-th argument; on MySQL,
// whose ? are taken in order, Args lists the argument (1-based) each ?
// takes.
type SQL struct {
	Text string
	Args []int
}

// q is a page's statement; args are MySQL's (see SQL).
func q(text string, args ...int) SQL { return SQL{Text: text, Args: args} }

// Dialect is one database: its statements and the differences between
// databases that are real.
type Dialect struct {
	Name  string // "postgres", "mysql", "sqlite": prefixes errors
	Quote string // quotes identifiers (`"` or "`")
	Bind  Bind
	// QualifyIndex: an index in another schema is named schema.index, its
	// table unqualified (SQLite).
	QualifyIndex bool
	// MigrateLock returns one row holding 1 once the lock is held. With
	// MigrateUnlock (a session lock, MySQL, whose DDL commits anyway) the
	// migrations run outside a transaction; without it in one transaction
	// that holds the lock. Empty: the transaction is the lock (SQLite).
	MigrateLock, MigrateUnlock string
	// Returning: UPDATE … RETURNING exists; else Reclaim re-reads the row
	// in its transaction.
	Returning bool
	// ChangedRows: an UPDATE storing the values already there reports no
	// affected row (MySQL), so 0 needs a second look (Exists,
	// ExtendCheck).
	ChangedRows bool
	// MaxPayloadHash is the longest payload hash the column holds; 0: any.
	MaxPayloadHash int
	// EncodeTime converts a time into an argument, failing for times the
	// column cannot hold; DecodeTime converts a scanned non-NULL value.
	// Both nil: the driver's own time.Time, sent in UTC (PostgreSQL).
	EncodeTime func(time.Time) (any, error)
	DecodeTime func(any) (time.Time, error)

	// ErrorCode returns the code of the database error in err's chain, ""
	// for none (default: Code, SQLSTATE or SQLite's extended result
	// code). Errors are recognised by code, never by text: a unique
	// violation (default: repository.IsUniqueViolation), a deadlock
	// victim whose transaction runs again, and a migration statement whose
	// effect is already there (MySQL has no CREATE INDEX IF NOT EXISTS).
	ErrorCode                              func(error) string
	UniqueViolation, Deadlock, AlreadyDone []string

	// Migrations holds the stores' migrations/{inbox,versions}/NNNN_name.up.sql;
	// the backend package adds it (With).
	Migrations fs.FS

	Inbox    InboxSQL
	Versions VersionsSQL
	Outbox   OutboxSQL
	Migrate  MigrateSQL
}

// With returns a copy of d with the backend package's migration files
// and, if not nil, its driver's error codes.
func (d *Dialect) With(migrations fs.FS, errorCode func(error) string) *Dialect {
	c := *d
	c.Migrations = migrations
	if errorCode != nil {
		c.ErrorCode = errorCode
	}
	return &c
}

// InboxSQL is the inbox's and the two-phase store's SQL. The arguments:
// consumer $1 and storage key $2 first, then as each field says.
type InboxSQL struct {
	// Claim inserts a completed marker ($3 payload hash, $4 now, $5
	// expiry) unless the key is taken; without a conflict clause
	// (MySQL) a taken key fails it with a unique violation.
	Claim SQL
	// ClaimBatch is Claim for many rows: its one VALUES row is repeated,
	// five arguments a row; with RETURNING where conflicts are ignored.
	ClaimBatch SQL
	Get        SQL // the record
	LockedGet  SQL // the record, latest committed
	Save       SQL // $3 result
	Exists     SQL // COUNT of the key, latest committed
	// Acquire inserts an in-progress record ($3 payload hash, $4 owner,
	// $5 lease until, $6 now, $7 expiry) unless the key is taken.
	Acquire SQL
	// Reclaim takes over a lease ($3 previous owner, $4 owner, $5 now, $6
	// lease until) that has expired; RETURNING the record where it can.
	Reclaim     SQL
	Extend      SQL // $3 owner, $4 lease until
	ExtendCheck SQL // COUNT of the lease $3 owner holds until $4
	Complete    SQL // $3 owner, $4 result, $5 now
	Release     SQL // $3 owner
	// List: stuck leases at $1 now, of consumer $2 ('' any), at most $3.
	List SQL
	// ResolveComplete and ResolveRelease end a stuck lease of $3 owner,
	// expired at $4 now, of a live record ($5 result).
	ResolveComplete, ResolveRelease SQL
	Live                            SQL // COUNT of the key live at $3
	Count                           SQL // records per consumer and state at $1
	// DeleteExpired deletes at most $2 rows expiring before $1, oldest
	// first, skipping locked ones. Where that is not one statement
	// (MySQL), PickExpired locks and returns their keys and DeleteByKeys
	// deletes n of them, in one READ COMMITTED transaction.
	DeleteExpired, PickExpired SQL
	DeleteByKeys               func(n int) SQL
	// PartitionedClaim and PartitionedAcquire are Claim and Acquire on a
	// partitioned table (PostgreSQL), whose unique index cannot span the
	// partitions: under the key's advisory lock, insert unless a row
	// exists, returning the row found (none: inserted).
	PartitionedClaim, PartitionedAcquire SQL
}

// VersionsSQL is the version store's SQL: $1 consumer, $2 entity, $3
// version.
type VersionsSQL struct {
	// Advance stores $3 if newer; its last statement affects one row
	// exactly when it did.
	Advance []SQL
	// Last reads the stored version (math.MinInt64 marks a row locked
	// before any version applied, MySQL).
	Last SQL
}

// OutboxSQL is the outbox's SQL: {T} its table, {D} its dead-letter
// table.
type OutboxSQL struct {
	// Insert writes one message ($1 topic, $2 UUID, $3 payload, $4
	// metadata, $5 InsertValue if set); its VALUES row is repeated for
	// more.
	Insert      SQL
	InsertValue func(size int, nowMicros int64) any
	// Claim returns the ids and sizes, not the payloads, of up to $2 rows
	// after id $1 in id order, so a batch can be bounded by bytes before
	// any payload is read; Fetch then reads the rows that fit. ClaimLocks:
	// Claim takes the rows; otherwise Fetch locks the rows it reads,
	// skipping rows other relays hold.
	Claim      SQL
	ClaimLocks bool
	// Fetch reads the rows whose ids are in $1 ($2: the relay's clock in
	// Unix microseconds) with their ages in microseconds.
	Fetch SQL
	// IDs encodes an id list as the $1 of Fetch, DeleteIDs, LockDead,
	// CopyDead and DeleteDead.
	IDs       func([]int64) any
	DeleteIDs SQL
	Charge    SQL // attempts + 1 of row $1
	// DeadLetter copies row $1 into {D} with attempts + $2 and last error
	// $3 ($4: the relay's clock); DeleteOne then deletes it.
	DeadLetter, DeleteOne SQL
	// Backlog: rows, the oldest's age in microseconds ($1: the relay's
	// clock) and dead letters.
	Backlog SQL
	// ListDead: a page of {T} (the dead-letter table) after id $1, of
	// topic $2 ('' any), at most $3, times in Unix microseconds.
	ListDead, CountDead SQL
	// LockDead locks and returns the dead letters whose ids are in $1;
	// CopyDead copies them into {T} as new rows ($2: the relay's clock),
	// in id order; DeleteDead deletes them.
	LockDead, CopyDead, DeleteDead SQL
	// Renames returns replacement pairs for names in the migration files
	// other than the tables and their indexes (see Line.Extra).
	Renames func(table string) []string
}

// MigrateSQL records migrations in MigrationsTable: $1 subject, $2
// version, $3 name.
type MigrateSQL struct {
	Probe, Forget, Applied, Record SQL
}

// errorCode is d's code of err.
func (d *Dialect) errorCode(err error) string {
	if err == nil {
		return ""
	}
	if d.ErrorCode != nil {
		return d.ErrorCode(err)
	}
	return Code(err)
}

// Code returns the code of the first error in err's chain that has one:
// a SQLState() string method (pgx's *pgconn.PgError, lib/pq's *pq.Error)
// or a Code() int method (modernc.org/sqlite's extended result code);
// "" for none.
func Code(err error) string {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		return state.SQLState()
	}
	var code interface{ Code() int }
	if errors.As(err, &code) {
		return strconv.Itoa(code.Code())
	}
	return ""
}

func (d *Dialect) isUniqueViolation(err error) bool {
	if len(d.UniqueViolation) == 0 {
		return repository.IsUniqueViolation(err)
	}
	return err != nil && slices.Contains(d.UniqueViolation, d.errorCode(err))
}

func (d *Dialect) isRetryable(err error) bool {
	return err != nil && slices.Contains(d.Deadlock, d.errorCode(err))
}

func (d *Dialect) isAlreadyDone(err error) bool {
	return err != nil && slices.Contains(d.AlreadyDone, d.errorCode(err))
}

// withDefaults returns a copy of d with its empty fields set.
func (d Dialect) withDefaults() *Dialect {
	if d.EncodeTime == nil {
		d.EncodeTime = func(t time.Time) (any, error) { return t.UTC(), nil }
	}
	return &d
}

// Config configures a store.
type Config struct {
	// Table is the store's table, optionally "schema.table", validated by
	// repository.ValidateTableName. Default: repository.DefaultTableName
	// (inbox), repository.DefaultVersionsTableName (versions).
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return repository.ValidateTableName(c.Table) }

// jsonIDs encodes ids as a JSON array, the outbox's id lists on MySQL
// and SQLite.
func jsonIDs(ids []int64) any {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// NotifyChannel is the PostgreSQL NOTIFY channel of an outbox table: its
// name when it fits the 63-byte identifier limit, else a prefix of it
// with a hash of the whole name.
func NotifyChannel(table string) string {
	if len(table) <= 63 {
		return table
	}
	sum := sha256.Sum256([]byte(table))
	return table[:46] + "_" + hex.EncodeToString(sum[:8])
}

// Of returns the dialect named name ("postgres", "mysql", "sqlite"), nil
// for another name.
func Of(name string) *Dialect {
	for _, d := range []*Dialect{Postgres, MySQL, SQLite} {
		if d.Name == name {
			return d
		}
	}
	return nil
}
