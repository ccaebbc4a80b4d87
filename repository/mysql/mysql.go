package mysql

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/watermill-idempotent/repository"
)

// SchemaSQL is the DDL for the default table name, the same statement
// Migrate runs; schema.sql in this package holds it for migration tools.
//
//go:embed schema.sql
var SchemaSQL string

// MaxPayloadHashLength is the longest payload hash, in bytes, that the
// payload_hash column holds. A SHA-256 (repository.HashPayload) is 32.
const MaxPayloadHashLength = 255

// MySQL error numbers the repository acts on.
const (
	erDupEntry     = 1062 // ER_DUP_ENTRY: the only error that means "duplicate"
	erLockDeadlock = 1213 // ER_LOCK_DEADLOCK: InnoDB rolled the transaction back
)

// migrateLock names the GET_LOCK that serialises Migrate across processes.
const migrateLock = "watermill_idempotent_migrate"

// deleteChunk bounds the primary keys one DELETE statement names, far below
// the 65,535 placeholders a prepared statement may have.
const deleteChunk = 500

// Config configures a Repository.
type Config struct {
	// Table is the inbox table, optionally database-qualified
	// ("database.table"). Default: repository.DefaultTableName. It is
	// validated with repository.ValidateTableName and quoted with
	// backticks.
	Table string
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = repository.DefaultTableName
	}
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	return repository.ValidateTableName(c.Table)
}

// Repository stores inbox records in MySQL or MariaDB (InnoDB). It
// implements repository.Transactional, repository.TwoPhase,
// repository.Reader and repository.Cleaner and is safe for concurrent use.
//
// Every value is checked to fit its column before it is sent (keys and
// consumers of at most 255 bytes, payload hashes of at most
// MaxPayloadHashLength bytes, timestamps in the DATETIME range of years
// 1000 to 9999), so no value is ever truncated, even under a non-strict
// sql_mode.
type Repository struct {
	db    *sql.DB
	table string // validated and quoted
	ddl   string

	claimSQL, selectSQL, lockingSelectSQL, saveSQL, existsSQL string
	pickExpiredSQL                                            string
	tp                                                        twoPhaseSQL
}

// NewRepository returns a Repository over db. It does not create the
// schema: call Migrate, or apply schema.sql with your migration tool. Any
// DSN works: the repository converts timestamps to and from UTC itself.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	if db == nil {
		return nil, errors.New("mysql: db is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	t, err := repository.QuoteTableName(config.Table, "`")
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	const columns = `consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at`
	r := &Repository{db: db, table: t, ddl: SchemaDDL(config.Table)}
	r.claimSQL = `INSERT INTO ` + t + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?, ?, 'completed', ?, 1, ?, ?, ?)`
	r.selectSQL = `SELECT ` + columns + ` FROM ` + t + ` WHERE consumer = ? AND dedup_key = ?`
	// A locking read returns the latest committed row, not the row as of
	// the transaction's REPEATABLE READ snapshot, which may predate it.
	// LOCK IN SHARE MODE is understood by MySQL 8 and every MariaDB.
	r.lockingSelectSQL = r.selectSQL + ` LOCK IN SHARE MODE`
	r.saveSQL = `UPDATE ` + t + ` SET result = ? WHERE consumer = ? AND dedup_key = ?`
	r.existsSQL = `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ? AND dedup_key = ? LOCK IN SHARE MODE`
	r.pickExpiredSQL = `SELECT consumer, dedup_key FROM ` + t + ` WHERE expires_at < ?
ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`
	r.tp = newTwoPhaseSQL(t, columns)
	return r, nil
}

// SchemaDDL returns the statement Migrate runs for table, for callers who
// apply schema with their own migration tool. table must be valid (see
// repository.ValidateTableName).
//
// consumer, dedup_key and lease_owner are VARBINARY(255): byte-exact
// comparison on every server (case, accents and trailing spaces all
// count), and 255 bytes is exactly repository.MaxKeyLength. A utf8mb4
// column would not do: the _ci collations fold case and accents,
// utf8mb4_bin ignores trailing spaces (PAD SPACE), and the one exact
// collation, utf8mb4_0900_bin, exists only on MySQL 8.
func SchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, "`")
	return "CREATE TABLE IF NOT EXISTS " + t + ` (
    consumer     VARBINARY(255) NOT NULL,
    dedup_key    VARBINARY(255) NOT NULL,
    state        VARCHAR(16)    NOT NULL,
    payload_hash VARBINARY(255),
    result       LONGBLOB,
    attempts     INT            NOT NULL DEFAULT 1,
    lease_owner  VARBINARY(255),
    lease_until  DATETIME(6),
    created_at   DATETIME(6)    NOT NULL,
    completed_at DATETIME(6),
    expires_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, dedup_key),
    KEY ` + "`" + repository.IndexName(table, "expires_at_idx") + "`" + ` (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
`
}

// Migrate creates the inbox table and its index if they do not exist. It
// is idempotent, and safe to run from several processes at once: it holds
// the named lock "watermill_idempotent_migrate" (GET_LOCK, waiting up to a
// minute) while it runs the DDL.
func (r *Repository) Migrate(ctx context.Context) error {
	// GET_LOCK belongs to a session, so lock, migrate and unlock on one
	// connection. If the connection dies, the server drops the lock.
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysql: migrate: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 60)`, migrateLock).Scan(&got); err != nil {
		return fmt.Errorf("mysql: migrate lock: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("mysql: migrate lock: GET_LOCK(%q) timed out after 60s", migrateLock)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, migrateLock) }()
	if _, err := conn.ExecContext(ctx, strings.TrimSuffix(strings.TrimSpace(r.ddl), ";")); err != nil {
		return fmt.Errorf("mysql: migrate: %w", err)
	}
	return nil
}

// ClaimTx implements repository.Transactional with one plain INSERT. The
// insert fails with error 1062 exactly when the (consumer, key) exists;
// then ClaimTx reads the stored record with a locking read in the same
// transaction. Any other error, and a 1062 for which no record matches the
// key exactly, is returned as an error, never as a duplicate. InnoDB
// rolls back only the failed statement on a duplicate, so the transaction
// stays usable. On error 1213 (deadlock) InnoDB has rolled the whole
// transaction back: the caller must roll back and retry the delivery.
func (r *Repository) ClaimTx(ctx context.Context, tx repository.Querier, p repository.ClaimParams) (repository.Claim, error) {
	if err := repository.ValidateClaim(p); err != nil {
		return repository.Claim{}, err
	}
	if err := validatePayloadHash(p.PayloadHash); err != nil {
		return repository.Claim{}, err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return repository.Claim{}, err
	}
	expires, err := datetime("ExpiresAt", p.ExpiresAt)
	if err != nil {
		return repository.Claim{}, err
	}
	key := repository.StorageKey(p.Key)
	_, err = tx.ExecContext(ctx, r.claimSQL, p.Consumer, key, p.PayloadHash, now, now, expires)
	if err == nil {
		return repository.Claim{Claimed: true}, nil
	}
	if !isDuplicate(err) {
		return repository.Claim{}, fmt.Errorf("mysql: claim: %w", explain(err))
	}
	rec, err := scan(tx.QueryRowContext(ctx, r.lockingSelectSQL, p.Consumer, key))
	if errors.Is(err, repository.ErrNotFound) {
		// The key collided with a row that does not match it exactly: it
		// was deleted in between (cleanup), or the value was cut to fit a
		// narrower column than ours under a non-strict sql_mode. Report it
		// rather than guess: the broker retries and the next claim decides.
		return repository.Claim{}, fmt.Errorf("mysql: claim: key is taken but no record matches it exactly: %w", err)
	}
	if err != nil {
		return repository.Claim{}, fmt.Errorf("mysql: read duplicate: %w", explain(err))
	}
	return repository.Claim{Existing: rec}, nil
}

// SaveResultTx implements repository.Transactional with one UPDATE; it
// returns repository.ErrNotFound if the transaction holds no such record.
func (r *Repository) SaveResultTx(ctx context.Context, tx repository.Querier, p repository.SaveResultParams) error {
	if err := repository.ValidateSaveResult(p); err != nil {
		return err
	}
	key := repository.StorageKey(p.Key)
	res, err := tx.ExecContext(ctx, r.saveSQL, p.Result, p.Consumer, key)
	if err != nil {
		return fmt.Errorf("mysql: save result: %w", explain(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mysql: save result: %w", err)
	}
	if n > 0 {
		return nil
	}
	// MySQL counts changed rows, not matched ones (unless the DSN sets
	// clientFoundRows): storing the value already there affects 0 rows.
	var count int
	if err := tx.QueryRowContext(ctx, r.existsSQL, p.Consumer, key).Scan(&count); err != nil {
		return fmt.Errorf("mysql: save result: %w", explain(err))
	}
	if count == 0 {
		return fmt.Errorf("mysql: save result: %w", repository.ErrNotFound)
	}
	return nil
}

// Get implements repository.Reader. It reads the latest committed record.
func (r *Repository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := scan(r.db.QueryRowContext(ctx, r.selectSQL, consumer, repository.StorageKey(key)))
	if err != nil {
		return repository.Record{}, fmt.Errorf("mysql: get: %w", err)
	}
	return rec, nil
}

// DeleteExpired implements repository.Cleaner. In one short READ
// COMMITTED transaction it picks at most limit expired rows in expires_at
// order with FOR UPDATE SKIP LOCKED and deletes them by primary key (in
// statements of at most 500 keys).
//
// Why not `DELETE … WHERE expires_at < ? ORDER BY expires_at LIMIT ?`:
// under REPEATABLE READ its range scan takes next-key (gap) locks on the
// expires_at index, up to the first live row or the end of the index,
// where new claims insert, and it waits on rows a claim holds. READ
// COMMITTED takes no gap locks, SKIP LOCKED passes over rows a claim holds
// (a later batch deletes them), and a DELETE naming primary keys is
// deterministic for statement-based replication. Servers with
// binlog_format=STATEMENT refuse writes under READ COMMITTED; use ROW or
// MIXED (the defaults of MySQL 8 and MariaDB).
func (r *Repository) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("mysql: delete expired: %w: limit must be positive", repository.ErrInvalidParams)
	}
	cutoff, err := datetime("before", before)
	if err != nil {
		return 0, fmt.Errorf("mysql: delete expired: %w", err)
	}
	tx, err := r.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("mysql: delete expired: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	pks, err := r.pickExpired(ctx, tx, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("mysql: delete expired: %w", err)
	}
	deleted := 0
	for len(pks) > 0 {
		chunk := pks[:min(len(pks), 2*deleteChunk)]
		pks = pks[len(chunk):]
		res, err := tx.ExecContext(ctx, r.deleteByKeysSQL(len(chunk)/2), chunk...)
		if err != nil {
			return 0, fmt.Errorf("mysql: delete expired: %w", explain(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("mysql: delete expired: %w", err)
		}
		deleted += int(n)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("mysql: delete expired: commit: %w", err)
	}
	return deleted, nil
}

// deleteByKeysSQL returns a DELETE of n rows named by primary key. The
// keys form a derived table joined first (STRAIGHT_JOIN) to the inbox, so
// each row is found by an eq_ref lookup on the primary key. A plain
// `WHERE (consumer = ? AND dedup_key = ?) OR …` is not used: on a small
// table (or with stale statistics) the optimizer scans it instead, and a
// scanning DELETE waits on every row a claim holds locked.
func (r *Repository) deleteByKeysSQL(n int) string {
	var b strings.Builder
	b.WriteString(`DELETE x FROM (SELECT ? AS consumer, ? AS dedup_key`)
	for range n - 1 {
		b.WriteString(` UNION ALL SELECT ?, ?`)
	}
	b.WriteString(`) AS d STRAIGHT_JOIN ` + r.table + ` AS x ON x.consumer = d.consumer AND x.dedup_key = d.dedup_key`)
	return b.String()
}

// pickExpired locks and returns the primary keys of at most limit expired
// rows, flattened as consumer, key, consumer, key, …
func (r *Repository) pickExpired(ctx context.Context, tx *sql.Tx, cutoff string, limit int) ([]any, error) {
	rows, err := tx.QueryContext(ctx, r.pickExpiredSQL, cutoff, limit)
	if err != nil {
		return nil, explain(err)
	}
	defer rows.Close()
	var pks []any
	for rows.Next() {
		var consumer, key []byte
		if err := rows.Scan(&consumer, &key); err != nil {
			return nil, err
		}
		pks = append(pks, consumer, key)
	}
	return pks, rows.Err()
}

func scan(row *sql.Row) (repository.Record, error) {
	var (
		rec                                           repository.Record
		state                                         string
		owner                                         sql.NullString
		leaseUntil, createdAt, completedAt, expiresAt utcTime
	)
	err := row.Scan(&rec.Consumer, &rec.Key, &state, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &leaseUntil, &createdAt, &completedAt, &expiresAt)
	if errors.Is(err, sql.ErrNoRows) {
		return repository.Record{}, repository.ErrNotFound
	}
	if err != nil {
		return repository.Record{}, err
	}
	rec.State = repository.State(state)
	rec.LeaseOwner = owner.String
	rec.LeaseUntil = leaseUntil.Time
	rec.CreatedAt = createdAt.Time
	rec.CompletedAt = completedAt.Time
	rec.ExpiresAt = expiresAt.Time
	return rec, nil
}

// isDuplicate reports whether err is MySQL error 1062, recognised by its
// number (messages vary across versions and languages).
func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erDupEntry
}

// explain adds what a deadlock means for the caller; other errors are
// returned as they are.
func explain(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == erLockDeadlock {
		return fmt.Errorf("deadlock: InnoDB rolled the whole transaction back; roll back and retry: %w", err)
	}
	return err
}

func validatePayloadHash(h []byte) error {
	if len(h) > MaxPayloadHashLength {
		return fmt.Errorf("%w: PayloadHash is %d bytes, at most %d fit", repository.ErrInvalidParams, len(h), MaxPayloadHashLength)
	}
	return nil
}

// DATETIME holds years 1000 to 9999; the layout is what MySQL prints for
// DATETIME(6), so strings compare like the times they spell.
const datetimeLayout = "2006-01-02 15:04:05.000000"

var (
	minDatetime = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	endDatetime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// datetime formats t in UTC for a DATETIME(6) column, truncated to the
// microsecond. Sending the text ourselves (the driver would send text too,
// in the DSN's loc) keeps stored values UTC whatever the DSN says.
func datetime(field string, t time.Time) (string, error) {
	u := t.UTC()
	if u.Before(minDatetime) || !u.Before(endDatetime) {
		return "", fmt.Errorf("%w: %s (%s) is outside the DATETIME range (years 1000 to 9999)", repository.ErrInvalidParams, field, t)
	}
	return u.Format(datetimeLayout), nil
}

// utcTime scans a DATETIME written by datetime as UTC, whether the driver
// hands it over as text (parseTime=false) or as a time.Time in the DSN's
// loc (parseTime=true), whose wall clock is the stored UTC value.
type utcTime struct{ Time time.Time }

func (u *utcTime) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		u.Time = time.Time{}
	case time.Time:
		u.Time = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	case []byte:
		return u.parse(string(v))
	case string:
		return u.parse(v)
	default:
		return fmt.Errorf("mysql: cannot scan %T into a timestamp", v)
	}
	return nil
}

func (u *utcTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("mysql: timestamp %q: %w", s, err)
	}
	u.Time = t
	return nil
}
