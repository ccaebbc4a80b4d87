package testenv

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// QueryCounter is a pgx.QueryTracer that counts the queries pgx sends,
// BEGIN and COMMIT included: one round trip each once prepared (a
// multi-statement query such as "begin; INSERT …" counts once). Set it
// as a pgx.ConnConfig's Tracer.
type QueryCounter struct{ n atomic.Int64 }

// Load returns how many queries have started.
func (c *QueryCounter) Load() int64 { return c.n.Load() }

// TraceQueryStart implements pgx.QueryTracer.
func (c *QueryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *QueryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
