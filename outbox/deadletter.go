package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// Limits of the dead-letter operator API.
const (
	// DefaultDeadLetterListLimit is the page size of DeadLetters.List
	// when ListParams.Limit is 0.
	DefaultDeadLetterListLimit = 100
	// MaxDeadLetterIDs is the most ids one Requeue or Delete call takes,
	// and the largest ListParams.Limit.
	MaxDeadLetterIDs = 1000
)

// ErrInvalidParams is returned by DeadLetters for a negative or too
// large limit or id list.
var ErrInvalidParams = errors.New("outbox: invalid parameters")

// DeadLetter is a row of the dead-letter table: an outbox message the
// relay gave up on.
type DeadLetter struct {
	// ID identifies the dead letter for Requeue and Delete.
	ID int64
	// OutboxID is the row's id in the outbox table when it was moved.
	OutboxID int64
	// Topic, UUID and Payload are the message's, unchanged.
	Topic   string
	UUID    string
	Payload []byte
	// Metadata is the stored metadata exactly as it was in the outbox
	// (JSON; for a row dead-lettered because it could not be decoded,
	// whatever it held).
	Metadata []byte
	// Attempts is the number of failed publishes charged to the row (0
	// for a row whose metadata could not be decoded).
	Attempts int
	// LastError is the publisher's (or decoder's) last error, as text.
	LastError string
	// CreatedAt is the outbox row's created_at; DeadLetteredAt when it
	// was moved (database clock; on MySQL read in the session time zone).
	CreatedAt, DeadLetteredAt time.Time
}

// ListParams selects a page of dead letters.
type ListParams struct {
	// AfterID lists dead letters with ID > AfterID; pass the last ID of
	// the previous page to page on. Default: 0 (from the first).
	AfterID int64
	// Topic, when not empty, lists only dead letters of that topic.
	Topic string
	// Limit is the page size. Default: DefaultDeadLetterListLimit (100);
	// at most MaxDeadLetterIDs.
	Limit int
}

// DeadLetters is the operator's view of an outbox's dead-letter table
// (DeadLetterTableName): list the messages the relay gave up on, put
// them back into the outbox, or delete them. It is safe for concurrent
// use, also with relays running.
type DeadLetters struct {
	db sqlstore.DB
	d  dialect
}

// NewDeadLetters returns the dead-letter API for the outbox described by
// config (the same Config as the Outbox and the relay).
func NewDeadLetters(db *sql.DB, config Config) (*DeadLetters, error) {
	return NewDeadLettersOn(sqlexec.Std(db), config)
}

// NewDeadLettersOn is NewDeadLetters on a pool of any driver behind
// sqlexec.DB (pgxoutbox.NewDeadLetters passes a pgx pool).
func NewDeadLettersOn(db sqlexec.DB, config Config) (*DeadLetters, error) {
	if db == nil {
		return nil, errors.New("outbox: dead letters: db is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &DeadLetters{db: db, d: newDialect(config.Dialect, config.Table)}, nil
}

// DeadLetters returns the dead-letter API of this outbox's table in db.
func (o *Outbox) DeadLetters(db *sql.DB) (*DeadLetters, error) {
	return NewDeadLetters(db, o.config)
}

// List returns a page of dead letters in id order (the order they were
// moved), with payloads.
func (dl *DeadLetters) List(ctx context.Context, params ListParams) ([]DeadLetter, error) {
	if params.Limit == 0 {
		params.Limit = DefaultDeadLetterListLimit
	}
	if params.Limit < 0 || params.Limit > MaxDeadLetterIDs {
		return nil, fmt.Errorf("%w: limit %d, want 1..%d", ErrInvalidParams, params.Limit, MaxDeadLetterIDs)
	}
	list := dl.d.listDead
	rows, err := dl.db.Query(ctx, list.SQL(), list.Args(params.AfterID, params.Topic, params.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var (
			l                DeadLetter
			created, movedAt int64
		)
		if err := rows.Scan(&l.ID, &l.OutboxID, &l.Topic, &l.UUID, &l.Payload, &l.Metadata, &l.Attempts, &l.LastError, &created, &movedAt); err != nil {
			return nil, fmt.Errorf("outbox: list dead letters: %w", err)
		}
		l.CreatedAt, l.DeadLetteredAt = time.UnixMicro(created), time.UnixMicro(movedAt)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return out, nil
}

// Count returns the number of dead letters.
func (dl *DeadLetters) Count(ctx context.Context) (int, error) {
	var n int
	if err := dl.db.QueryRow(ctx, dl.d.countDead.SQL()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count dead letters: %w", err)
	}
	return n, nil
}

// Requeue moves the dead letters ids back into the outbox in one
// transaction: each becomes a new outbox row (a new id, created_at now,
// attempts 0) with its topic, UUID, payload and metadata unchanged, and
// its dead letter is deleted. The relay then publishes it like any other
// row (on PostgreSQL the insert sends NOTIFY). It returns how many were
// moved; ids that do not exist (already requeued or deleted) are skipped,
// and of two concurrent calls for one id exactly one moves it.
func (dl *DeadLetters) Requeue(ctx context.Context, ids ...int64) (int, error) {
	if err := checkIDs(ids); err != nil || len(ids) == 0 {
		return 0, err
	}
	var n int
	err := dl.db.InTx(ctx, true, func(tx sqlstore.Executor) error {
		var err error
		n, err = dl.d.requeue(ctx, tx, ids)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: requeue dead letters: %w", err)
	}
	return n, nil
}

// Delete deletes the dead letters ids for good and returns how many
// existed.
func (dl *DeadLetters) Delete(ctx context.Context, ids ...int64) (int, error) {
	if err := checkIDs(ids); err != nil || len(ids) == 0 {
		return 0, err
	}
	del := dl.d.deleteDead
	n, err := dl.db.Exec(ctx, del.SQL(), del.Args(dl.d.ids(ids))...)
	if err != nil {
		return 0, fmt.Errorf("outbox: delete dead letters: %w", err)
	}
	return int(n), nil
}

func checkIDs(ids []int64) error {
	if len(ids) > MaxDeadLetterIDs {
		return fmt.Errorf("%w: %d ids, at most %d per call", ErrInvalidParams, len(ids), MaxDeadLetterIDs)
	}
	return nil
}
