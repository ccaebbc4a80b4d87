package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// The store runs on the public executor of package sqlexec.
type (
	Executor = sqlexec.Executor
	Row      = sqlexec.Row
	Rows     = sqlexec.Rows
	DB       = sqlexec.DB
)

// StdDB adapts a database/sql pool; nil stays nil.
func StdDB(db *sql.DB) DB { return sqlexec.Std(db) }

// StdQuerier adapts a transaction (*sql.Tx, *sql.Conn).
func StdQuerier(q sqlexec.Querier) Executor { return sqlexec.StdTx(q) }

// OrNil returns v, or nil when err is not nil, and err: a backend's
// constructor wrapping a store it failed to make returns no wrapper.
func OrNil[T any](v *T, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Stmt is a statement bound for a table: order maps each placeholder to
// its argument (Question), max is the highest $n, so extra arguments are
// not sent.
type Stmt struct {
	text  string
	order []int
	max   int
	// inline: send the values written into the text (see send).
	inline bool
}

var numberedRe = regexp.MustCompile(`[$?](\d+)`)

// Bound binds a page's statement to a quoted table; {D} stays for the
// caller to replace first.
func (d *Dialect) Bound(quotedTable string, s SQL) Stmt {
	st := Stmt{text: strings.ReplaceAll(s.Text, "{T}", quotedTable)}
	if d.Bind == Question {
		if n := strings.Count(st.text, "?"); n != len(s.Args) {
			panic(fmt.Sprintf("%s: %d placeholders but %d arguments in %s", d.Name, n, len(s.Args), s.Text))
		}
		for _, a := range s.Args {
			st.order = append(st.order, a-1)
		}
		return st
	}
	for _, m := range numberedRe.FindAllStringSubmatch(st.text, -1) {
		n, _ := strconv.Atoi(m[1])
		st.max = max(st.max, n)
	}
	return st
}

// Statement binds query, written with {T} for the quoted table and the
// driver's numbered placeholders ($n, ?n), to the table.
func (d *Dialect) Statement(quotedTable, query string) Stmt {
	return d.Bound(quotedTable, SQL{Text: query})
}

// Repeat returns s with its one VALUES row repeated n times, the
// placeholders of row r taking the arguments of row r (perRow arguments
// a row): a multi-row INSERT.
func (d *Dialect) Repeat(s SQL, n, perRow int) SQL {
	start := strings.Index(s.Text, "VALUES (") + len("VALUES ")
	end := start + strings.IndexByte(s.Text[start:], ')') + 1
	row := s.Text[start:end]
	var b strings.Builder
	b.WriteString(s.Text[:start])
	out := SQL{}
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteString(numberedRe.ReplaceAllStringFunc(row, func(m string) string {
			k, _ := strconv.Atoi(m[1:])
			return m[:1] + strconv.Itoa(perRow*r+k)
		}))
		for _, a := range s.Args {
			out.Args = append(out.Args, perRow*r+a)
		}
	}
	b.WriteString(s.Text[end:])
	out.Text = b.String()
	return out
}

// SQL is the statement's text.
func (s Stmt) SQL() string { return s.text }

// Args returns args in the order the statement's placeholders take them,
// without those it does not use.
func (s Stmt) Args(args ...any) []any {
	if s.order == nil {
		return args[:min(len(args), s.max)]
	}
	out := make([]any, len(s.order))
	for i, a := range s.order {
		out[i] = args[a]
	}
	return out
}

func (s Stmt) exec(ctx context.Context, ex Executor, args ...any) (int64, error) {
	text, vals := s.send(args)
	return ex.Exec(ctx, text, vals...)
}

func (s Stmt) row(ctx context.Context, ex Executor, args ...any) Row {
	text, vals := s.send(args)
	return ex.QueryRow(ctx, text, vals...)
}
