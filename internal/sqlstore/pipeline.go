package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// ClaimLiteral returns the transactional claim of p as one INSERT with its
// values written into the text and without the conflict clause, so that
// a driver can send it in the same round trip as BEGIN, as one simple
// query ("begin; INSERT …"): a key already taken fails it with a unique
// violation (Dialect.IsUniqueViolation), which aborts the transaction, and
// a key held by a transaction still open makes it wait for that one, as
// the conditional insert does. Only PostgreSQL (Dollar) dialects have it.
//
// The values cannot inject SQL: text and bytes travel as hexadecimal
// digits (decode('…', 'hex')), times as digits and separators.
func (s *Inbox) ClaimLiteral(p repository.ClaimParams) (string, error) {
	if s.d.Bind != Dollar {
		return "", fmt.Errorf("%s: claim literal: %w: only PostgreSQL sends the claim with BEGIN", s.d.Name, repository.ErrInvalidParams)
	}
	if err := repository.ValidateClaim(p); err != nil {
		return "", err
	}
	if _, err := s.args(p.PayloadHash); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + s.t.quoted + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at) VALUES (`)
	b.WriteString(textLiteral(p.Consumer) + `, ` + textLiteral(repository.StorageKey(p.Key)) + `, 'completed', `)
	b.WriteString(bytesLiteral(p.PayloadHash) + `, 1, `)
	now := timeLiteral(p.Now)
	b.WriteString(now + `, ` + now + `, ` + timeLiteral(p.ExpiresAt) + `)`)
	return b.String(), nil
}

// GetOn is Get on any driver's connection or transaction.
func (s *Inbox) GetOn(ctx context.Context, ex Executor, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := s.get(ctx, ex, s.q.get, consumer, repository.StorageKey(key))
	return rec, s.wrap("get", err)
}

// textLiteral writes s as PostgreSQL text made of hex digits.
func textLiteral(s string) string {
	return `convert_from(decode('` + hex.EncodeToString([]byte(s)) + `', 'hex'), 'UTF8')`
}

// bytesLiteral writes b as a PostgreSQL bytea made of hex digits; nil is NULL.
func bytesLiteral(b []byte) string {
	if b == nil {
		return `NULL`
	}
	return `decode('` + hex.EncodeToString(b) + `', 'hex')`
}

// timeLiteral writes t as a PostgreSQL timestamptz in UTC, to the
// microsecond the column keeps.
func timeLiteral(t time.Time) string {
	return `'` + t.UTC().Format("2006-01-02T15:04:05.999999Z07:00") + `'::timestamptz`
}
