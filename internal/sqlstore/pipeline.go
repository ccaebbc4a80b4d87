package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
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
	args, err := s.claimArgs(p)
	if err != nil {
		return "", err
	}
	plain := s.q.claim
	plain.text = strings.TrimSuffix(plain.text, s.d.IgnoreConflict)
	text, ok := inlined(s.d.Bind, plain, args)
	if !ok {
		return "", fmt.Errorf("%s: claim literal: %w: a value has no literal form", s.d.Name, repository.ErrInvalidParams)
	}
	return text, nil
}

// claimArgs are the claim statement's arguments, $1…$5.
func (s *Inbox) claimArgs(p repository.ClaimParams) ([]any, error) {
	return s.args(p.PayloadHash, p.Consumer, repository.StorageKey(p.Key), p.PayloadHash, p.Now, p.ExpiresAt)
}

// inlined returns st's text with args written in as literals of
// placeholder style b, so that a driver sends it as it is: on MySQL that
// spares the prepare round trip go-sql-driver/mysql spends on every
// statement with arguments (unless the DSN sets interpolateParams). ok is
// false for SQLite (in process, nothing to spare) and for a value without
// a literal form here.
//
// The values cannot inject SQL: text and bytes travel as hexadecimal
// digits, times and numbers as digits and separators.
func inlined(b Bind, st stmt, args []any) (text string, ok bool) {
	var ph *regexp.Regexp
	switch b {
	case Dollar:
		ph = dollarRe
	case Question:
		ph = questionRe
	default:
		return "", false
	}
	vals := st.values(args)
	lits := make([]string, len(vals))
	for i, v := range vals {
		if lits[i], ok = literal(b, v); !ok {
			return "", false
		}
	}
	next := 0
	text = ph.ReplaceAllStringFunc(st.text, func(m string) string {
		i := next
		next++
		if b == Dollar {
			n, _ := strconv.Atoi(m[1:])
			i = n - 1
		}
		if i < 0 || i >= len(lits) {
			ok = false
			return m
		}
		return lits[i]
	})
	return text, ok
}

var questionRe = regexp.MustCompile(`\?`)

// literal writes v as a literal for placeholder style b's database.
func literal(b Bind, v any) (string, bool) {
	pg := b == Dollar
	switch v := v.(type) {
	case nil:
		return `NULL`, true
	case []byte:
		if v == nil {
			return `NULL`, true
		}
		if pg {
			return `decode('` + hex.EncodeToString(v) + `', 'hex')`, true
		}
		return `X'` + hex.EncodeToString(v) + `'`, true
	case string:
		if pg {
			return `convert_from(decode('` + hex.EncodeToString([]byte(v)) + `', 'hex'), 'UTF8')`, true
		}
		if plainText.MatchString(v) {
			return `'` + v + `'`, true // a DATETIME, say: compared as text
		}
		return `X'` + hex.EncodeToString([]byte(v)) + `'`, true
	case time.Time:
		if !pg {
			return "", false
		}
		return `'` + v.UTC().Format("2006-01-02T15:04:05.999999Z07:00") + `'::timestamptz`, true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	}
	return "", false
}

// plainText is text that needs no quoting in any SQL mode.
var plainText = regexp.MustCompile(`^[0-9A-Za-z :._-]*$`)

// send returns the text and arguments to send for st: with the values
// written in when st.inline (the inbox's statements on MySQL, see
// inlined), so the statement costs one round trip whatever the DSN says;
// otherwise as they are.
func (s stmt) send(args []any) (string, []any) {
	if s.inline {
		if text, ok := inlined(Question, s, args); ok {
			return text, nil
		}
	}
	return s.text, s.values(args)
}

// GetOn is Get on any driver's connection or transaction.
func (s *Inbox) GetOn(ctx context.Context, ex Executor, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := s.get(ctx, ex, s.q.get, consumer, repository.StorageKey(key))
	return rec, s.wrap("get", err)
}
