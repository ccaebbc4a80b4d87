package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Database names a supported database.
type Database string

// The databases the examples run on.
const (
	Postgres Database = "postgres"
	SQLite   Database = "sqlite"
)

// Store is the examples' database: the inbox table, the outbox table
// (PostgreSQL only), the charges ledger and the receipts. Every table name
// carries a run suffix, so runs and tests sharing a server never collide.
type Store struct {
	DB       *sql.DB
	Database Database

	Inbox    repository.Driver[*sql.Tx]
	Outbox   *outbox.Outbox // nil on SQLite: the outbox needs PostgreSQL or MySQL
	Tables   Tables
	chargeQ  string
	receiptQ string
}

// Tables are the names of a run's tables.
type Tables struct {
	Inbox, Outbox, Charges, Receipts string
}

// TablesFor returns the table names of run (letters, digits, underscores).
func TablesFor(run string) Tables {
	return Tables{
		Inbox:    "shop_inbox_" + run,
		Outbox:   "shop_outbox_" + run,
		Charges:  "shop_charges_" + run,
		Receipts: "shop_receipts_" + run,
	}
}

// NewStore creates the run's tables in db and returns the Store.
func NewStore(ctx context.Context, db *sql.DB, database Database, run string) (*Store, error) {
	s := &Store{DB: db, Database: database, Tables: TablesFor(run)}
	for _, t := range []string{s.Tables.Inbox, s.Tables.Outbox, s.Tables.Charges, s.Tables.Receipts} {
		if err := repository.ValidateTableName(t); err != nil {
			return nil, fmt.Errorf("run %q: %w", run, err)
		}
	}
	ph := func(n int) string { return fmt.Sprintf("$%d", n) }
	switch database {
	case Postgres:
		repo, err := postgres.NewRepository(db, postgres.Config{Table: s.Tables.Inbox})
		if err != nil {
			return nil, err
		}
		if err := repo.Migrate(ctx); err != nil {
			return nil, fmt.Errorf("inbox schema: %w", err)
		}
		s.Inbox = repo
		ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: s.Tables.Outbox})
		if err != nil {
			return nil, err
		}
		if err := ob.Migrate(ctx, db); err != nil {
			return nil, fmt.Errorf("outbox schema: %w", err)
		}
		s.Outbox = ob
	case SQLite:
		repo, err := sqlite.NewRepository(db, sqlite.Config{Table: s.Tables.Inbox})
		if err != nil {
			return nil, err
		}
		if err := repo.Migrate(ctx); err != nil {
			return nil, fmt.Errorf("inbox schema: %w", err)
		}
		s.Inbox = repo
		ph = func(int) string { return "?" }
	default:
		return nil, fmt.Errorf("unknown database %q: want postgres or sqlite", database)
	}
	// No unique constraint on order_id: the ledger must be able to show a
	// double charge if one ever happened, not turn it into an error.
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS ` + s.Tables.Charges + ` (order_id TEXT NOT NULL, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + s.Tables.Receipts + ` (payment_uuid TEXT NOT NULL, order_id TEXT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return nil, fmt.Errorf("shop schema: %w", err)
		}
	}
	s.chargeQ = fmt.Sprintf(`INSERT INTO %s (order_id, customer, amount_cents) VALUES (%s, %s, %s)`, s.Tables.Charges, ph(1), ph(2), ph(3))
	s.receiptQ = fmt.Sprintf(`INSERT INTO %s (payment_uuid, order_id) VALUES (%s, %s)`, s.Tables.Receipts, ph(1), ph(2))
	return s, nil
}

// Charge records a charge through tx.
func (s *Store) Charge(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
	if _, err := tx.ExecContext(ctx, s.chargeQ, o.OrderID, o.Customer, o.Amount); err != nil {
		return fmt.Errorf("charging %s: %w", o.OrderID, err)
	}
	return nil
}

// Receipt records a receipt through tx.
func (s *Store) Receipt(ctx context.Context, tx *sql.Tx, paymentUUID string, p PaymentCompleted) error {
	if _, err := tx.ExecContext(ctx, s.receiptQ, paymentUUID, p.OrderID); err != nil {
		return fmt.Errorf("receipt for %s: %w", p.OrderID, err)
	}
	return nil
}

// CustomerTotals is what the charges table holds for one customer.
type CustomerTotals struct {
	Charges int // rows
	Cents   int
}

// Charged reads the ledger: per customer, and how many orders were
// charged more than once.
func (s *Store) Charged(ctx context.Context) (byCustomer map[string]CustomerTotals, chargedOrders, doubleCharged int, err error) {
	rows, err := s.DB.QueryContext(ctx, `SELECT customer, COUNT(*), SUM(amount_cents) FROM `+s.Tables.Charges+` GROUP BY customer`)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading charges: %w", err)
	}
	defer rows.Close()
	byCustomer = map[string]CustomerTotals{}
	for rows.Next() {
		var c string
		var t CustomerTotals
		if err := rows.Scan(&c, &t.Charges, &t.Cents); err != nil {
			return nil, 0, 0, err
		}
		byCustomer[c] = t
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, err
	}
	err = s.DB.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN n > 1 THEN 1 ELSE 0 END), 0) FROM (SELECT order_id, COUNT(*) AS n FROM `+s.Tables.Charges+` GROUP BY order_id) AS per_order`).
		Scan(&chargedOrders, &doubleCharged)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading charges: %w", err)
	}
	return byCustomer, chargedOrders, doubleCharged, nil
}

// Receipts returns the number of receipt rows and of distinct orders with
// a receipt.
func (s *Store) Receipts(ctx context.Context) (rows, orders int, err error) {
	err = s.DB.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM `+s.Tables.Receipts).Scan(&rows, &orders)
	if err != nil {
		return 0, 0, fmt.Errorf("reading receipts: %w", err)
	}
	return rows, orders, nil
}

// OutboxBacklog returns the rows the relay has not forwarded yet (0 without
// an outbox).
func (s *Store) OutboxBacklog(ctx context.Context) (int, error) {
	if s.Outbox == nil {
		return 0, nil
	}
	var n int
	if err := s.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.Tables.Outbox).Scan(&n); err != nil {
		return 0, fmt.Errorf("reading the outbox: %w", err)
	}
	return n, nil
}

// Drop deletes the run's tables (and the outbox's notify function).
func (s *Store) Drop(ctx context.Context) error {
	var errs []error
	for _, t := range []string{s.Tables.Inbox, s.Tables.Outbox, outbox.DeadLetterTableName(s.Tables.Outbox), s.Tables.Charges, s.Tables.Receipts} {
		if _, err := s.DB.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			errs = append(errs, fmt.Errorf("dropping %s: %w", t, err))
		}
	}
	if s.Database == Postgres {
		if _, err := s.DB.ExecContext(ctx, `DROP FUNCTION IF EXISTS `+s.Tables.Outbox+`_notify()`); err != nil {
			errs = append(errs, fmt.Errorf("dropping %s_notify(): %w", s.Tables.Outbox, err))
		}
	}
	return errors.Join(errs...)
}
