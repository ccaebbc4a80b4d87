// Package sqlrepo holds the steps the SQL backends (postgres, mysql,
// sqlite) share once their dialect-specific statement has run: reading
// affected rows, fencing two-phase writes, explaining a refused operator
// action, and scanning records and record counts.
package sqlrepo

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Affected returns the rows a statement's result affected, or err.
func Affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Fenced turns the outcome of a statement guarded by state and owner into
// the two-phase contract's error: repository.ErrLeaseLost when it matched
// no row. prefix names the backend ("postgres") and op the operation.
func Fenced(prefix, op string, res sql.Result, err error) error {
	n, err := Affected(res, err)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", prefix, op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %s: %w", prefix, op, repository.ErrLeaseLost)
	}
	return nil
}

// Resolved finishes an operator Resolve whose fenced statement returned
// res/err. When it changed no row, exists (a query counting the live
// record, with existsArgs) tells repository.ErrNotFound from
// repository.ErrLeaseLost.
func Resolved(ctx context.Context, db *sql.DB, prefix string, p repository.ResolveParams, res sql.Result, err error, exists string, existsArgs ...any) error {
	n, err := Affected(res, err)
	if err != nil {
		return fmt.Errorf("%s: resolve (%s): %w", prefix, p.Action, err)
	}
	if n == 1 {
		return nil
	}
	var count int
	if err := db.QueryRowContext(ctx, exists, existsArgs...).Scan(&count); err != nil {
		return fmt.Errorf("%s: resolve (%s): %w", prefix, p.Action, err)
	}
	if count == 0 {
		return fmt.Errorf("%s: resolve (%s) %q/%q: %w", prefix, p.Action, p.Consumer, p.Key, repository.ErrNotFound)
	}
	return fmt.Errorf("%s: resolve (%s) %q/%q: the record is no longer in progress under an expired lease of %q: %w",
		prefix, p.Action, p.Consumer, p.Key, p.ExpectedOwner, repository.ErrLeaseLost)
}

// RecordCounts scans the rows of a count-records query (consumer,
// in_progress, stale, completed) returned by QueryContext as rows/err.
func RecordCounts(prefix string, rows *sql.Rows, err error) ([]repository.RecordCount, error) {
	return collect(prefix, "count records", rows, err, func(rows *sql.Rows) (repository.RecordCount, error) {
		var c repository.RecordCount
		err := rows.Scan(&c.Consumer, &c.InProgress, &c.Stale, &c.Completed)
		return c, err
	})
}

// Records scans the record rows of a query (returned by QueryContext as
// rows/err) with the backend's scan function. op names the operation in
// errors ("list stuck").
func Records(prefix, op string, rows *sql.Rows, err error, scan func(*sql.Rows) (repository.Record, error)) ([]repository.Record, error) {
	return collect(prefix, op, rows, err, scan)
}

// collect reads every row with scan, closes rows, and wraps any error as
// "<prefix>: <op>: <err>".
func collect[T any](prefix, op string, rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", prefix, op, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", prefix, op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", prefix, op, err)
	}
	return out, nil
}
