// Package mysql is the MySQL/MariaDB backend of the inbox, used through
// database/sql with the github.com/go-sql-driver/mysql driver. It needs
// InnoDB and MySQL 8.0+ or MariaDB 10.6+ (cleanup uses SKIP LOCKED).
//
//	db, _ := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/app?interpolateParams=true")
//	repo, err := mysql.NewRepository(db, mysql.Config{})
//	if err != nil { … }
//	if err := repo.Migrate(ctx); err != nil { … }
//
// interpolateParams=true is recommended: without it go-sql-driver prepares
// every parameterized statement on the server first, one more round trip
// per statement; with it the inbox measured 30–41 % more messages per
// second on MariaDB (docs/benchmarks.md). The repository only sends
// values through placeholders, so interpolation is safe here.
//
// Claims are a plain INSERT against the primary key (consumer, dedup_key).
// Only MySQL error 1062 (ER_DUP_ENTRY), recognised by number, means
// "duplicate"; every other failure is returned as an error, whatever the
// session's sql_mode. INSERT IGNORE is not used because it downgrades
// unrelated errors (truncation, NULL into NOT NULL, bad values) to
// warnings, and the caller would then skip a message it never processed.
// A second transaction claiming the same key waits on the first one's row
// lock, then sees its outcome; the stored record is read with a locking
// read so that a REPEATABLE READ snapshot taken earlier cannot hide it.
//
// Keys, consumers and lease owners are VARBINARY: compared byte for byte,
// so "Order-1", "order-1" and "order-1 " are three keys (utf8mb4 collations
// fold case or accents, or ignore trailing spaces). Timestamps are
// DATETIME(6) in UTC. The repository writes and reads them in UTC itself,
// so it does not depend on the DSN's parseTime or loc settings.
//
// One InnoDB behaviour differs from PostgreSQL: when a claim rolls back
// while two or more transactions wait on its key, InnoDB lets one waiter
// claim and resolves the others with a deadlock (error 1213), rolling
// their whole transaction back. ClaimTx returns that error; the delivery
// is retried by the broker and then sees the committed record. No effect
// happens twice.
//
// Cleanup picks expired rows with FOR UPDATE SKIP LOCKED in a READ
// COMMITTED transaction and deletes them by primary key, so it takes no
// gap locks and never waits on a claim. The schema is in migrations/.
package mysql
