package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
	"sync"

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
	return preparedExec{plain: StdQuerier(tx), tx: tx, db: d.db, cache: &s.prepared}
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
	plain Executor
	tx    *sql.Tx
	db    *sql.DB
	cache *preparedStmts
}

func (e preparedExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	st := e.cache.get(e.db, query)
	if st == nil {
		return e.plain.Exec(ctx, query, args...)
	}
	res, err := e.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	if err != nil {
		if isForeignStmt(err) {
			return e.plain.Exec(ctx, query, args...)
		}
		return 0, err
	}
	return res.RowsAffected()
}

func (e preparedExec) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	return e.plain.Query(ctx, query, args...)
}

func (e preparedExec) QueryRow(ctx context.Context, query string, args ...any) Row {
	st := e.cache.get(e.db, query)
	if st == nil {
		return e.plain.QueryRow(ctx, query, args...)
	}
	return foreignRow{e.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...), func() Row { return e.plain.QueryRow(ctx, query, args...) }}
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
