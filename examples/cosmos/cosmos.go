// Package cosmos applies messages to a document store the way the
// Idempotent Consumer pattern is taught on Azure Cosmos DB: the document's
// id is the message's natural key, so the store's uniqueness of ids is the
// deduplication marker — no inbox table — and a create that conflicts
// (Cosmos answers HTTP 409) is answered by comparing the payload's hash
// stored in the document:
//
//   - the same hash: a copy of a message already applied; the handler
//     returns middleware.ErrNaturalDuplicate and middleware.NaturalKey
//     acknowledges it;
//   - another hash: the key was reused for other content; the handler
//     returns idempotency.ErrPayloadMismatch, which idempotency.IsPermanent
//     sends to the poison queue.
//
// The router:
//
//	poison, err := wmiddleware.PoisonQueueWithFilter(pub, "orders_poison", idempotency.IsPermanent)
//	if err != nil {
//		return err
//	}
//	router.AddMiddleware(poison, middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "shop"}).Middleware)
//	router.AddConsumerHandler("orders", "orders", sub, cosmos.Handler(container, middleware.JSONFieldKey("id")))
//
// Container is the store. Postgres, a JSONB document table on PostgreSQL,
// is the stand-in the tests run on; docs/brokers.md shows the Cosmos SDK
// (azcosmos) form, untested here.
package cosmos

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// ErrConflict is returned by Container.Create when a document with the id
// exists (Cosmos DB: HTTP 409 Conflict).
var ErrConflict = errors.New("cosmos: a document with this id exists")

// Container is the part of a document store the handler needs.
type Container interface {
	// Create stores doc under id if no document has that id, atomically,
	// and returns ErrConflict (possibly wrapped) if one has.
	Create(ctx context.Context, id string, doc []byte) error
	// Read returns the document stored under id.
	Read(ctx context.Context, id string) ([]byte, error)
}

// Document is what Apply stores: the id, the hash of the message payload
// (hex SHA-256, repository.HashPayload) and the payload itself, which must
// be JSON.
type Document struct {
	ID          string          `json:"id"`
	PayloadHash string          `json:"payloadHash"`
	Body        json.RawMessage `json:"body"`
}

// Apply creates the document id for payload. On a conflict it reads the
// stored document and compares the payload hashes: equal, it returns
// middleware.ErrNaturalDuplicate; different, idempotency.ErrPayloadMismatch
// (wrapped). Other errors are returned wrapped, to be retried.
func Apply(ctx context.Context, c Container, id string, payload []byte) error {
	hash := hex.EncodeToString(repository.HashPayload(payload))
	doc, err := json.Marshal(Document{ID: id, PayloadHash: hash, Body: payload})
	if err != nil {
		return fmt.Errorf("cosmos: document %q: the payload must be JSON: %w", id, err)
	}
	err = c.Create(ctx, id, doc)
	if !errors.Is(err, ErrConflict) {
		if err != nil {
			return fmt.Errorf("cosmos: create document %q: %w", id, err)
		}
		return nil
	}
	stored, err := c.Read(ctx, id)
	if err != nil {
		return fmt.Errorf("cosmos: read document %q after a conflict: %w", id, err)
	}
	var existing Document
	if err := json.Unmarshal(stored, &existing); err != nil {
		return fmt.Errorf("cosmos: document %q: %w", id, err)
	}
	if existing.PayloadHash != hash {
		return fmt.Errorf("%w: document %q holds payload %s, the message has %s",
			idempotency.ErrPayloadMismatch, id, existing.PayloadHash, hash)
	}
	return middleware.ErrNaturalDuplicate
}

// Handler returns a handler that applies each message as the document
// key(msg) names. Put middleware.NaturalKey around it, so that
// ErrNaturalDuplicate is acknowledged, and the poison queue
// (idempotency.IsPermanent) around that.
func Handler(c Container, key middleware.KeyFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		id, err := key(msg)
		if err != nil {
			return err
		}
		if id == "" {
			return idempotency.ErrNoKey
		}
		return Apply(msg.Context(), c, id, msg.Payload)
	}
}

// Postgres is a Container on a PostgreSQL table of JSONB documents keyed
// by id, the stand-in for a Cosmos DB container in the tests.
type Postgres struct {
	DB    *sql.DB
	Table string // Default: "documents"
}

func (p Postgres) table() string {
	if p.Table == "" {
		return "documents"
	}
	return p.Table
}

// Migrate creates the table unless it exists.
func (p Postgres) Migrate(ctx context.Context) error {
	_, err := p.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+p.table()+` (id TEXT PRIMARY KEY, doc JSONB NOT NULL)`)
	return err
}

// Create implements Container with one INSERT … ON CONFLICT DO NOTHING:
// the primary key decides a race between two copies, and a conflict does
// not abort a surrounding transaction.
func (p Postgres) Create(ctx context.Context, id string, doc []byte) error {
	res, err := p.DB.ExecContext(ctx, `INSERT INTO `+p.table()+` (id, doc) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, doc)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrConflict
	}
	return nil
}

// Read implements Container.
func (p Postgres) Read(ctx context.Context, id string) ([]byte, error) {
	var doc []byte
	err := p.DB.QueryRowContext(ctx, `SELECT doc FROM `+p.table()+` WHERE id = $1`, id).Scan(&doc)
	return doc, err
}
