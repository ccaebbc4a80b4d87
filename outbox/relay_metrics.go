package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/fanout"
)

// RelayObserver receives a report of every relay batch that claimed
// rows or failed: the extension point for metrics (metrics.Metrics
// implements it) and tracing (tracing.Tracer does). It is called on the
// relay's goroutine, so it must be fast, and safe for concurrent use
// when one value is shared by several relays. An Observer that also
// implements BacklogObserver gets backlog samples too, and one that
// implements RelayBatchStarter is told when each batch begins.
type RelayObserver interface {
	ObserveRelayBatch(ctx context.Context, b RelayBatch)
}

// RelayBatchStarter is the optional part of a RelayObserver, found by
// type assertion: when RelayConfig.Observer implements it, a batch
// begins with StartRelayBatch (b holds Relay only) as soon as it has
// claimed rows, and the rest of it runs in the context it returns — its
// statements and the context of the messages it publishes. Every batch so
// begun is reported to ObserveRelayBatch with that context, also one
// stopped by its context, so an Observer can start a span here and end
// it there (see package tracing). A poll that finds no row begins no
// batch, so an idle relay starts nothing; a batch that fails before it
// claims (the database unreachable) is reported without a start.
type RelayBatchStarter interface {
	StartRelayBatch(ctx context.Context, b RelayBatch) context.Context
}

// BacklogObserver is the optional part of a RelayObserver, found by type
// assertion: when RelayConfig.Observer implements it, Run samples Backlog
// when it starts and then every RelayConfig.BacklogInterval, on a
// goroutine of its own, and reports each successful sample. A failed
// sample is logged and skipped. ObserveBacklog must be safe for
// concurrent use with ObserveRelayBatch.
type BacklogObserver interface {
	ObserveBacklog(ctx context.Context, b Backlog)
}

// Backlog is the state of the outbox table at one moment.
type Backlog struct {
	// Relay is the sampling relay's RelayConfig.Name in a sample reported
	// to a BacklogObserver; empty from Relay.Backlog.
	Relay string
	// Messages is the number of rows not yet acknowledged, including
	// rows claimed by a batch in flight.
	Messages int
	// OldestAge is the age of the oldest row by the database's clock
	// (now minus its created_at); 0 when the outbox is empty.
	OldestAge time.Duration
	// DeadLetters is the number of rows in the dead-letter table.
	DeadLetters int
}

// RelayBatch describes one relay batch.
type RelayBatch struct {
	// Relay is the relay's RelayConfig.Name.
	Relay string
	// Err is the batch's error; nil unless it failed (the relay retries
	// after RelayConfig.RetryInterval). A batch stopped by its context
	// is not a failure.
	Err error
	// Claimed is the number of rows read and locked.
	Claimed int
	// Published is the number of messages published and acknowledged
	// (deleted) in the batch's commit — 0 if the commit failed.
	Published int
	// DeadLettered is the number of rows moved to the dead-letter table
	// in the batch's commit.
	DeadLettered int
	// DeadLetterFailures is the number of rows due for the dead-letter
	// table whose move failed (the table dropped or not writable, a
	// full disk): each move was undone alone, its row stays in the
	// outbox and is tried again by a later batch, and the batch's
	// published rows were acknowledged all the same. Not a failure of
	// the batch (Err): the relay logs these apart, at most once a
	// minute.
	DeadLetterFailures int
	// Duration is the batch's wall time from BEGIN to COMMIT.
	Duration time.Duration
	// Lag holds, for each of the Published messages in publish order,
	// the time from its row's created_at until its Publish call
	// returned. The part up to the statement that reads the row is
	// measured by the database's clock (created_at is the writing
	// transaction's start on PostgreSQL and the INSERT on MySQL, in the
	// session time zone, so writers and relay must share one), the rest
	// by the relay's
	// monotonic clock, so skew between the two clocks does not enter.
	// A negative age (the database clock stepped back) counts as 0.
	Lag []time.Duration
}

// RelayObservers returns a RelayObserver reporting to every one of obs,
// in turn; each implementing RelayBatchStarter starts the batch in the
// context the one before returned. It is a BacklogObserver only if one
// of obs is, and its backlog samples go to those: the relay samples no
// backlog for observers that take none. Nil entries are skipped. Being
// a RelayBatchStarter itself, it is reported every batch the relay
// begins.
func RelayObservers(obs ...RelayObserver) RelayObserver {
	if fanout.Any[BacklogObserver](obs) {
		return backlogObservers{obs}
	}
	return relayObservers(obs)
}

type relayObservers []RelayObserver

// backlogObservers are relay observers of which one at least takes
// backlog samples.
type backlogObservers struct{ relayObservers }

func (o relayObservers) ObserveRelayBatch(ctx context.Context, b RelayBatch) {
	fanout.Report(ctx, o, b, RelayObserver.ObserveRelayBatch)
}

func (o backlogObservers) ObserveBacklog(ctx context.Context, b Backlog) {
	fanout.Report(ctx, o.relayObservers, b, BacklogObserver.ObserveBacklog)
}

func (o relayObservers) StartRelayBatch(ctx context.Context, b RelayBatch) context.Context {
	return fanout.Start(ctx, o, b, RelayBatchStarter.StartRelayBatch)
}

// sampleBacklog reports Backlog to o now and every BacklogInterval until
// ctx ends.
func (r *Relay) sampleBacklog(ctx context.Context, o BacklogObserver) {
	ticker := time.NewTicker(r.config.BacklogInterval)
	defer ticker.Stop()
	for {
		b, err := r.Backlog(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.logger.Error("Outbox backlog sample failed", err, nil)
		default:
			b.Relay = r.config.Name
			o.ObserveBacklog(ctx, b)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Backlog counts the outbox's rows, the age of the oldest and the rows of
// the dead-letter table with one query, a full scan of both tables
// (COUNT(*) and MIN(created_at)). It takes
// no locks: rows claimed by a batch in flight are counted until that
// batch commits. Safe to call at any time, concurrently with Run.
func (r *Relay) Backlog(ctx context.Context) (Backlog, error) {
	var n, dead int
	var ageMicros int64
	if err := r.db.QueryRow(ctx, r.d.backlog.SQL(), r.d.backlog.Args(time.Now().UnixMicro())...).Scan(&n, &ageMicros, &dead); err != nil {
		return Backlog{}, fmt.Errorf("outbox: relay: backlog: %w", err)
	}
	return Backlog{Messages: n, OldestAge: microseconds(ageMicros), DeadLetters: dead}, nil
}

// microseconds converts an age computed by the database, never negative.
func microseconds(n int64) time.Duration {
	return time.Duration(max(n, 0)) * time.Microsecond
}
