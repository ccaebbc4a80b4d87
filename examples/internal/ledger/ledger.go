// Package ledger holds what the broker examples (servicebus, eventhubs,
// cosmos, migrate-deduplicator) share and a service does not need: the
// inbox's repository, an effect made once per message (a row in a table
// "ledger", written in the inbox transaction), an Observer counting the
// inbox's outcomes so that a program or a test waits for its deliveries
// instead of sleeping, and a Topic keeping what a poison queue publishes.
package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// Repository returns the inbox's repository on db (PostgreSQL, the
// default table), its table created.
func Repository(ctx context.Context, db *sql.DB) (*postgres.Repository[*sql.Tx], error) {
	repo, err := postgres.NewRepository(db, postgres.Config{})
	if err != nil {
		return nil, err
	}
	return repo, repo.Migrate(ctx)
}

// Migrate creates the inbox's table and the ledger in db (PostgreSQL).
func Migrate(ctx context.Context, db *sql.DB) (*postgres.Repository[*sql.Tx], error) {
	repo, err := Repository(ctx, db)
	if err != nil {
		return nil, err
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ledger (uuid TEXT NOT NULL, payload TEXT NOT NULL)`)
	return repo, err
}

// Record is a handler: it writes msg to the ledger through the inbox
// transaction (idempotency.Tx), so the row and the inbox's marker commit
// together.
func Record(msg *message.Message) error {
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(msg.Context(), `INSERT INTO ledger (uuid, payload) VALUES ($1, $2)`, msg.UUID, string(msg.Payload))
	return err
}

// Count returns the ledger's rows and its distinct payloads.
func Count(ctx context.Context, db *sql.DB) (rows, distinct int, err error) {
	err = db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT payload) FROM ledger`).Scan(&rows, &distinct)
	return rows, distinct, err
}

// Outcomes is a idempotency.Observer counting the inbox's outcomes.
type Outcomes struct {
	mu sync.Mutex
	n  map[idempotency.Outcome]int
}

// ObserveDelivery implements idempotency.Observer.
func (o *Outcomes) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[idempotency.Outcome]int{}
	}
	o.n[d.Outcome]++
}

// Count returns how many deliveries had outcome.
func (o *Outcomes) Count(outcome idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[outcome]
}

// Acked returns how many deliveries were acknowledged: processed,
// duplicates and replays.
func (o *Outcomes) Acked() int {
	return o.Count(idempotency.OutcomeProcessed) + o.Count(idempotency.OutcomeDuplicate) + o.Count(idempotency.OutcomeReplayed)
}

// WaitAcked polls until at least n deliveries were acknowledged, or ctx
// ends.
func (o *Outcomes) WaitAcked(ctx context.Context, n int) error {
	for o.Acked() < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d acknowledged deliveries (have %d): %w", n, o.Acked(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// Topic is a message.Publisher that keeps what is published to it, a
// poison topic to look at.
type Topic struct {
	mu   sync.Mutex
	msgs []*message.Message
}

// Publish implements message.Publisher.
func (p *Topic) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, msgs...)
	return nil
}

// Close implements message.Publisher.
func (p *Topic) Close() error { return nil }

// Messages returns what was published.
func (p *Topic) Messages() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}
