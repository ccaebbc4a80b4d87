package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
// The values cannot inject SQL: text travels as an escape string (E'…'
// with backslashes and quotes doubled), bytes as hexadecimal digits,
// times as digits and separators.
func (s *Inbox) ClaimLiteral(p repository.ClaimParams) (string, error) {
	if s.d.Bind != Dollar {
		return "", fmt.Errorf("%s: claim literal: %w: only PostgreSQL sends the claim with BEGIN", s.d.Name, repository.ErrInvalidParams)
	}
	plain := s.d.Bound(s.t.quoted, s.d.Inbox.ClaimWithBegin)
	return s.claimInlined("claim literal", plain, p)
}

// ClaimStatement returns the plain claim INSERT that ClaimLiteral writes
// out, with its parameters ($1 consumer, $2 storage key, $3 payload hash,
// $4 now, $5 expiry) left in, for preparing it on a connection (see
// ClaimExecute). Only PostgreSQL dialects use it.
func (s *Inbox) ClaimStatement() string {
	return s.d.Bound(s.t.quoted, s.d.Inbox.ClaimWithBegin).text
}

// ClaimExecute is ClaimLiteral for a connection on which ClaimStatement
// is prepared as name (a plain identifier the caller chose): "EXECUTE
// name(…)" with p's values written in. The server runs the prepared plan
// instead of parsing and planning the INSERT for every claim.
func (s *Inbox) ClaimExecute(name string, p repository.ClaimParams) (string, error) {
	if s.d.Bind != Dollar || !identRe.MatchString(name) {
		return "", fmt.Errorf("%s: claim execute: %w: PostgreSQL and a plain statement name only", s.d.Name, repository.ErrInvalidParams)
	}
	return s.claimInlined("claim execute", Stmt{text: `EXECUTE ` + name + `($1, $2, $3, $4, $5)`, max: 5}, p)
}

// claimInlined is st, a statement of the claim's arguments, with p's
// values written in.
func (s *Inbox) claimInlined(what string, st Stmt, p repository.ClaimParams) (string, error) {
	if err := repository.ValidateClaim(p); err != nil {
		return "", err
	}
	args, err := s.claimArgs(p)
	if err != nil {
		return "", err
	}
	text, ok := inlined(Dollar, st, args)
	if !ok {
		return "", fmt.Errorf("%s: %s: %w: a value has no literal form", s.d.Name, what, repository.ErrInvalidParams)
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
// The values cannot inject SQL: bytes travel as hexadecimal digits, text
// as hexadecimal digits (MySQL) or an escape string (PostgreSQL), times
// and numbers as digits and separators.
func inlined(b Bind, st Stmt, args []any) (text string, ok bool) {
	var ph *regexp.Regexp
	switch b {
	case Dollar:
		ph = numberedRe
	case Question:
		ph = questionRe
	default:
		return "", false
	}
	vals := st.Args(args...)
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
			return `E'\\x` + hex.EncodeToString(v) + `'::bytea`, true
		}
		return `X'` + hex.EncodeToString(v) + `'`, true
	case string:
		if pg {
			// An escape string means the same whatever
			// standard_conforming_strings says; text here is valid UTF-8
			// without NUL (repository.ValidateClaim), and pgx connects
			// with client_encoding UTF8. (convert_from(decode(hex)) would
			// need no escaping, but costs the server about 80 µs a claim.)
			return `E'` + pgEscape.Replace(v) + `'`, true
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

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

var pgEscape = strings.NewReplacer(`\`, `\\`, `'`, `''`)

// plainText is text that needs no quoting in any SQL mode.
var plainText = regexp.MustCompile(`^[0-9A-Za-z :._-]*$`)

// send returns the text and arguments to send for st: with the values
// written in when st.inline (the inbox's statements on MySQL, see
// inlined), so the statement costs one round trip whatever the DSN says;
// otherwise as they are.
func (s Stmt) send(args []any) (string, []any) {
	if s.inline {
		if text, ok := inlined(Question, s, args); ok {
			return text, nil
		}
	}
	return s.text, s.Args(args...)
}

// GetOn is Get on any driver's connection or transaction.
func (s *Inbox) GetOn(ctx context.Context, ex Executor, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := s.get(ctx, ex, s.q.get, consumer, repository.StorageKey(key))
	return rec, s.wrap("get", err)
}

// txExec returns the executor for a caller's database/sql transaction.
// On SQLite, where a statement costs CPU rather than a round trip and
// modernc.org/sqlite compiles every statement it is given, it runs the
// store's statements as statements prepared once on the store's own
// *sql.DB (tx.StmtContext reuses them on the transaction's connection).
func (s *Inbox) txExec(q repository.Querier) Executor {
	tx, ok := q.(*sql.Tx)
	d, std := s.db.(stdDB)
	if !ok || !std || s.d.Bind != QuestionNumbered {
		return StdQuerier(q)
	}
	return preparedExec{stdExec: stdExec{tx}, tx: tx, db: d.db, cache: &s.prepared}
}

// preparedStmts are statements prepared on the store's *sql.DB, by text.
type preparedStmts struct{ m sync.Map } // string → *preparedStmt

type preparedStmt struct {
	once sync.Once
	st   *sql.Stmt // nil until prepared, or if preparing failed
	done chan struct{}
}

// get returns the prepared statement for query, or nil while it is being
// prepared: a first use starts preparing it in the background, since the
// pool may have no connection to spare until the caller's transaction
// ends (SQLite's pool holds one).
func (p *preparedStmts) get(db *sql.DB, query string) *sql.Stmt {
	v, _ := p.m.LoadOrStore(query, &preparedStmt{done: make(chan struct{})})
	ps := v.(*preparedStmt)
	select {
	case <-ps.done:
		return ps.st
	default:
	}
	ps.once.Do(func() {
		go func() {
			defer close(ps.done)
			if st, err := db.Prepare(query); err == nil {
				ps.st = st
			}
		}()
	})
	return nil
}

type preparedExec struct {
	stdExec
	tx    *sql.Tx
	db    *sql.DB
	cache *preparedStmts
}

func (e preparedExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	st := e.cache.get(e.db, query)
	if st == nil {
		return e.stdExec.Exec(ctx, query, args...)
	}
	res, err := e.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	if err != nil {
		if isForeignStmt(err) {
			return e.stdExec.Exec(ctx, query, args...)
		}
		return 0, err
	}
	return res.RowsAffected()
}

func (e preparedExec) QueryRow(ctx context.Context, query string, args ...any) Row {
	st := e.cache.get(e.db, query)
	if st == nil {
		return e.stdExec.QueryRow(ctx, query, args...)
	}
	return foreignRow{e.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...), func() Row { return e.stdExec.QueryRow(ctx, query, args...) }}
}

// foreignRow runs the statement unprepared when the transaction belongs
// to another *sql.DB than the store's.
type foreignRow struct {
	row   *sql.Row
	plain func() Row
}

func (r foreignRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if isForeignStmt(err) {
		return r.plain().Scan(dest...)
	}
	return err
}

// isForeignStmt recognises database/sql refusing a statement prepared on
// another *sql.DB than the transaction's.
func isForeignStmt(err error) bool {
	return err != nil && strings.Contains(err.Error(), "statement from different database")
}
