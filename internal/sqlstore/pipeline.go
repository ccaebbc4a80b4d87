package sqlstore

import (
	"context"
	"encoding/hex"
	"regexp"
	"strconv"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// claimArgs are the claim statement's arguments, $1…$5.
func (s *Inbox) claimArgs(p repository.ClaimParams) ([]any, error) {
	return s.args(p.PayloadHash, p.Consumer, repository.StorageKey(p.Key), p.PayloadHash, p.Now, p.ExpiresAt)
}

// inlined returns st's text with args written in as MySQL literals, so
// that go-sql-driver/mysql sends it as it is, sparing the prepare round
// trip it spends on every statement with arguments (unless the DSN sets
// interpolateParams, which a store cannot set on its caller's *sql.DB).
// ok is false for a value without a literal form here: st is then sent
// with bound arguments.
//
// No value is quoted by hand, so none can inject SQL or depend on the
// connection's character set or sql_mode (NO_BACKSLASH_ESCAPES): bytes
// and text travel as hexadecimal digits (X'…', a binary string the
// column converts from, as it does a bound argument), numbers as digits;
// only text of digits, letters and ":._- " (a DATETIME, say) is written
// between quotes as it is.
func inlined(st Stmt, args []any) (text string, ok bool) {
	vals := st.Args(args...)
	lits := make([]string, len(vals))
	for i, v := range vals {
		if lits[i], ok = literal(v); !ok {
			return "", false
		}
	}
	next := 0
	text = questionRe.ReplaceAllStringFunc(st.text, func(m string) string {
		if next >= len(lits) {
			ok = false
			return m
		}
		next++
		return lits[next-1]
	})
	return text, ok
}

var questionRe = regexp.MustCompile(`\?`)

// literal writes v as a MySQL literal.
func literal(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return `NULL`, true
	case []byte:
		if v == nil {
			return `NULL`, true
		}
		return `X'` + hex.EncodeToString(v) + `'`, true
	case string:
		if plainText.MatchString(v) {
			return `'` + v + `'`, true // a DATETIME, say: compared as text
		}
		return `X'` + hex.EncodeToString([]byte(v)) + `'`, true
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
func (s Stmt) send(args []any) (string, []any) {
	if s.inline {
		if text, ok := inlined(s, args); ok {
			return text, nil
		}
	}
	return s.text, s.Args(args...)
}

// GetOn is Get on any driver's connection or transaction.
func (s *Inbox) GetOn(ctx context.Context, ex Executor, consumer, key string) (repository.Record, error) {
	if err := storekit.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := s.get(ctx, ex, s.q.get, consumer, repository.StorageKey(key))
	return rec, s.wrap("get", err)
}
