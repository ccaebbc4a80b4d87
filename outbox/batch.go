package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
)

type claimedRow struct {
	id       int64
	topic    string
	msg      *message.Message
	attempts int
	// created is when the row was written, on the relay's clock: the
	// start of the fetch query less the row's age at it, by the
	// database's clock.
	created time.Time
	// undecodable is set when the row's metadata is not a JSON object
	// of strings: publishing it can never succeed.
	undecodable error
}

// ForwardBatch forwards one batch and returns the number of messages
// published and acknowledged (deleted). Run calls it in a loop; call it
// yourself to drain the outbox from a cron job or a test. It is safe to
// call from several goroutines and processes at once: SKIP LOCKED gives
// each caller different rows.
//
// A batch is one transaction: claim up to BatchSize rows in id order,
// cut to MaxBatchBytes (a larger row goes alone), read them, publish them
// (consecutive rows of one topic in one Publish call), delete the
// published rows, charge failed attempts and move dead letters, commit.
//
// If a Publish call fails, the batch stops there: the messages published
// before it are acknowledged and the error is returned; the rest stay in
// the outbox and are retried first, so a failure that does not last
// keeps id order across topics. The failed topic's next batch isolates
// the failure by publishing in halves down to single rows, so the rows
// around a poison row flow. Each topic is a destination of its own,
// judged apart: a message accepted on one topic says nothing about
// another's broker, partition or leader, so once a topic isolates, its
// failures stop only that topic and the other topics overtake it.
//
// A row whose own single-row Publish fails is charged one attempt when
//   - RelayConfig.IsPermanent says the error is permanent, or
//   - its topic accepted a message after the first refused call that
//     held the row, in this batch or an earlier one of this relay: the
//     topic works, so the failure is the row's, or
//   - it was charged before (its attempts are not 0), by this relay or
//     another: that evidence outlives a relay's memory.
//
// Otherwise the row is charged nothing: its topic may be down. A topic
// that accepted nothing in a batch and refused such a row is presumed
// down, and its next batch first publishes its last row alone and stops
// the topic there if that fails too (Run also backs off, see
// RelayConfig.MaxRetryInterval). So in a topic outage, where every call
// to the topic fails from its start to its end, no row first refused
// during it is ever charged, however long it lasts; a row refused while
// other rows of its topic went out — a poison row, also one left alone
// on a quiet topic after the rest of its batch was published — is
// charged on each retry. A row first refused alone, on a topic that has
// accepted nothing since, cannot be told from an outage and waits for
// another row of its topic to go out, or for IsPermanent.
//
// A row charged MaxAttempts times is moved to the dead-letter table (see
// DeadLetters): at once for a permanent error, otherwise only once its
// refusals span RelayConfig.MinRefusalSpan. A row whose metadata cannot
// be decoded is moved at once. Each move runs in a savepoint of the
// batch's transaction: a move that fails (the dead-letter table dropped
// or not writable, a full disk) is undone alone and its row stays in
// the outbox, while the published rows are still acknowledged; it is
// counted in RelayBatch.DeadLetterFailures and logged at most once a
// minute. If ctx ends or the commit fails, nothing is acknowledged or
// charged and everything claimed is published again later. What the
// relay learnt about topics is its own: a restarted relay, or a replica,
// starts without it, which delays a charge (on a quiet topic, of a row
// never charged, until another row of its topic goes out) and never
// hastens one. See docs/outbox.md.
func (r *Relay) ForwardBatch(ctx context.Context) (int, error) {
	res, err := r.forwardBatch(ctx)
	return len(res.lag), err
}

// forwardBatch runs forward and reports it to the Observer.
func (r *Relay) forwardBatch(ctx context.Context) (batchResult, error) {
	start := time.Now()
	res, err := r.forward(ctx)
	if o := r.config.Observer; o != nil && (res.ctx != nil || res.claimed > 0 || (err != nil && ctx.Err() == nil)) {
		b := RelayBatch{
			Relay: r.config.Name, Claimed: res.claimed, Published: len(res.lag), DeadLettered: res.deadLettered,
			DeadLetterFailures: res.failedMoves, Duration: time.Since(start), Lag: res.lag,
		}
		if ctx.Err() == nil {
			b.Err = err
		}
		if res.ctx != nil {
			ctx = res.ctx // the batch's, from StartRelayBatch
		}
		o.ObserveRelayBatch(ctx, b)
	}
	return res, err
}

// batchResult is what one batch committed.
type batchResult struct {
	claimed int
	// ctx is the context StartRelayBatch returned, nil if the batch
	// claimed nothing or the Observer has no RelayBatchStarter.
	ctx          context.Context
	lag          []time.Duration // one per published and acknowledged message
	deadLettered int
	charged      int // rows charged a failed attempt and kept
	failedMoves  int // rows whose move to the dead-letter table failed, kept
}

// progressed reports whether the batch removed rows from the outbox, so
// Run looks again at once.
func (b batchResult) progressed() bool { return len(b.lag) > 0 || b.deadLettered > 0 }

// committed reports whether the batch wrote anything: a failed batch that
// did proves the database and the publisher answer, so Run does not back
// off after it.
func (b batchResult) committed() bool { return b.progressed() || b.charged > 0 }

// errNoCommit ends a batch that changed nothing: roll back.
var errNoCommit = errors.New("outbox: relay: nothing to commit")

// batchOutcome is what one batch's transaction did.
type batchOutcome struct {
	claimed int
	ctx     context.Context // see batchResult.ctx
	p       *batchPublish   // nil when nothing was claimed
	dead    []deadLetter    // due for the dead-letter table
	charged []deadLetter    // charged one attempt, kept
	moved   []deadLetter    // of dead, moved to the dead-letter table
	failed  []failedMove    // of dead, the moves undone, their rows kept
	pubErr  error           // the publisher's failure, if any
	err     error           // a database error, or errNoCommit: roll back
}

// failedMove is a move to the dead-letter table that failed and was
// undone.
type failedMove struct {
	deadLetter
	moveErr error
}

// forward runs one batch; see ForwardBatch.
func (r *Relay) forward(ctx context.Context) (batchResult, error) {
	var out batchOutcome
	began := false
	// READ COMMITTED: on InnoDB the locking read then takes no gap locks,
	// so writers inserting new rows never wait for the relay.
	err := r.db.InTx(ctx, true, func(tx sqlstore.Executor) error {
		began = true
		out = r.batch(ctx, tx)
		return out.err
	})
	res := batchResult{claimed: out.claimed, ctx: out.ctx}
	switch {
	case !began && err != nil:
		return res, fmt.Errorf("outbox: relay: begin: %w", err)
	case errors.Is(err, errNoCommit):
		return res, out.pubErr
	case out.err != nil:
		return res, errors.Join(out.pubErr, err)
	case err != nil:
		return res, errors.Join(out.pubErr, fmt.Errorf("outbox: relay: commit: %w", err))
	}
	res.lag, res.deadLettered, res.charged, res.failedMoves = out.p.lag, len(out.moved), len(out.charged), len(out.failed)
	moved := make([]int64, len(out.moved))
	for i, d := range out.moved {
		moved[i] = d.row.id
	}
	r.hist.forget(moved)
	r.logOutcome(out)
	r.logMoveFailures(out.failed)
	return res, out.pubErr
}

// logOutcome logs a committed batch: each charge at Info, each dead
// letter at Error.
func (r *Relay) logOutcome(out batchOutcome) {
	for _, d := range out.charged {
		r.logger.Info("Outbox relay: publisher refused a message, will retry", watermill.LogFields{
			"message_uuid": d.row.msg.UUID, "topic": d.row.topic, "outbox_id": d.row.id,
			"attempts": d.attempts, "max_attempts": r.config.MaxAttempts, "error": d.err.Error(),
		})
	}
	for _, d := range out.moved {
		r.logger.Error("Outbox relay: message moved to the dead-letter table", d.err, watermill.LogFields{
			"message_uuid": d.row.msg.UUID, "topic": d.row.topic, "outbox_id": d.row.id,
			"attempts": d.attempts, "dead_letter_table": r.deadLetterTable,
		})
	}
	r.logger.Trace("Outbox relay batch", watermill.LogFields{
		"claimed": out.claimed, "published": len(out.p.lag), "dead_lettered": len(out.moved), "dead_letter_failures": len(out.failed),
	})
}

// batch claims, publishes (see batchPublish) and acknowledges in tx. Its
// err is errNoCommit when there is nothing to write, or a database error
// that rolls the batch back.
func (r *Relay) batch(ctx context.Context, tx sqlstore.Executor) batchOutcome {
	rows, started, err := r.claim(ctx, tx)
	out := batchOutcome{claimed: len(rows), ctx: started, err: err}
	if err != nil {
		return out
	}
	if len(rows) == 0 {
		out.err = errNoCommit
		return out
	}
	if started != nil {
		ctx = started
	}
	out.p = newBatchPublish(r.pub, r.config.IsPermanent, r.hist, rows)
	published := out.p.run()
	out.pubErr = published.err
	out.dead, out.charged = out.p.verdicts(published.charge, r.config.MaxAttempts, r.config.MinRefusalSpan)
	if out.p.accepted == 0 && len(out.dead) == 0 && len(out.charged) == 0 {
		out.err = errNoCommit
		return out
	}
	out.moved, out.failed, out.err = r.write(ctx, tx, out)
	return out
}

// write acknowledges the published rows, counts the charged attempts
// and moves the dead letters, in tx. It returns the rows moved, the
// moves that failed and were undone, and an error that rolls the whole
// batch back.
func (r *Relay) write(ctx context.Context, tx sqlstore.Executor, out batchOutcome) (moved []deadLetter, failed []failedMove, err error) {
	if ids := out.p.publishedIDs(); len(ids) > 0 {
		if _, err := tx.Exec(ctx, r.d.deleteAcked.SQL(), r.d.deleteAcked.Args(r.d.ids(ids))...); err != nil {
			return nil, nil, fmt.Errorf("outbox: relay: acknowledge %d rows: %w", len(ids), err)
		}
	}
	for _, d := range out.charged {
		if _, err := tx.Exec(ctx, r.d.charge.SQL(), r.d.charge.Args(d.row.id)...); err != nil {
			return nil, nil, fmt.Errorf("outbox: relay: count attempt of row %d: %w", d.row.id, err)
		}
	}
	for _, d := range out.dead {
		moveErr, err := r.moveDeadLetter(ctx, tx, d)
		switch {
		case err != nil:
			return nil, nil, err
		case moveErr != nil:
			failed = append(failed, failedMove{deadLetter: d, moveErr: moveErr})
		default:
			moved = append(moved, d)
		}
	}
	return moved, failed, nil
}

// The savepoint around a move to the dead-letter table; the statements
// are the same on PostgreSQL, MySQL/MariaDB and SQLite.
const (
	savepointMove  = `SAVEPOINT outbox_dead_letter`
	releaseMove    = `RELEASE SAVEPOINT outbox_dead_letter`
	rollbackToMove = `ROLLBACK TO SAVEPOINT outbox_dead_letter`
)

// Failed moves are logged at most once per moveFailureLogEvery.
const (
	moveFailureLogEvery   = time.Minute
	moveFailureLogMessage = "Outbox relay: could not move messages to the dead-letter table; they stay in the outbox and are tried again"
)

// moveDeadLetter copies d's row into the dead-letter table and deletes
// it from the outbox, in a savepoint of tx. If either statement fails
// (the dead-letter table dropped, a revoked grant, a full disk), only the
// move is undone: moveErr says why, the row stays, and the batch's
// acknowledgements still commit — PostgreSQL would otherwise abort the
// whole transaction, and undo them with it. err is set when the
// transaction itself is gone (ctx ended, the connection broke, MySQL
// rolled it back on a deadlock: then the savepoint is gone too): it ends
// the batch.
func (r *Relay) moveDeadLetter(ctx context.Context, tx sqlstore.Executor, d deadLetter) (moveErr, err error) {
	if _, err := tx.Exec(ctx, savepointMove); err != nil {
		return nil, fmt.Errorf("outbox: relay: dead-letter row %d: %w", d.row.id, err)
	}
	_, moveErr = tx.Exec(ctx, r.d.deadLetter.SQL(), r.d.deadLetter.Args(d.row.id, d.attempts-d.row.attempts, errorText(d.err), time.Now().UnixMicro())...)
	if moveErr == nil {
		_, moveErr = tx.Exec(ctx, r.d.deleteOne.SQL(), r.d.deleteOne.Args(d.row.id)...)
	}
	if moveErr == nil {
		if _, err := tx.Exec(ctx, releaseMove); err != nil {
			return nil, fmt.Errorf("outbox: relay: dead-letter row %d: %w", d.row.id, err)
		}
		return nil, nil
	}
	if _, err := tx.Exec(ctx, rollbackToMove); err != nil {
		return nil, fmt.Errorf("outbox: relay: dead-letter row %d: %w (undoing the move: %w)", d.row.id, moveErr, err)
	}
	if _, err := tx.Exec(ctx, releaseMove); err != nil {
		return nil, fmt.Errorf("outbox: relay: dead-letter row %d: %w", d.row.id, err)
	}
	return fmt.Errorf("outbox: relay: move row %d to the dead-letter table %s: %w", d.row.id, r.deadLetterTable, moveErr), nil
}

// moveFailureLog rate-limits the log of failed moves to the dead-letter
// table: a table that is gone fails every batch that holds a dead letter.
type moveFailureLog struct {
	mu     sync.Mutex
	last   time.Time
	missed int // failures not logged since last
}

// logMoveFailures logs failed moves at Error, at most once per
// moveFailureLogEvery, with the number of failures since the last log.
func (r *Relay) logMoveFailures(failed []failedMove) {
	if len(failed) == 0 {
		return
	}
	l := &r.moveFailures
	l.mu.Lock()
	l.missed += len(failed)
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < moveFailureLogEvery {
		l.mu.Unlock()
		return
	}
	n := l.missed
	l.last, l.missed = now, 0
	l.mu.Unlock()
	f := failed[0]
	r.logger.Error(moveFailureLogMessage, f.moveErr, watermill.LogFields{
		"message_uuid": f.row.msg.UUID, "topic": f.row.topic, "outbox_id": f.row.id,
		"dead_letter_table": r.deadLetterTable, "failures": n, "log_interval": moveFailureLogEvery,
	})
}

// maxErrorText bounds the last_error stored with a dead letter.
const maxErrorText = 4000

// errorText is err's message as both databases accept it in a text
// column: valid UTF-8, without NUL bytes, at most maxErrorText bytes. A
// publisher error may echo arbitrary bytes; refusing them would fail the
// batch's commit forever.
func errorText(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// claimWindows is how many windows of BatchSize rows a MySQL claim
// looks at when every row of a window is locked by other relays.
const claimWindows = 4

// claim locks up to BatchSize rows in id order, keeps the longest prefix
// within MaxBatchBytes (at least one row) and reads those rows, sorted by
// id. On PostgreSQL, rows locked beyond the prefix stay in the table and
// are skipped by other relays until this batch ends.
//
// The batch begins (RelayBatchStarter) when its first window of ids is
// claimed, so a poll that finds nothing begins nothing; started is the
// context it returned, nil if it did not begin.
func (r *Relay) claim(ctx context.Context, tx sqlstore.Executor) (rows []claimedRow, started context.Context, err error) {
	after := int64(math.MinInt64)
	for range claimWindows {
		ids, err := r.claimWindow(ctx, tx, after)
		if err != nil || len(ids) == 0 {
			return nil, started, err
		}
		if s, ok := r.config.Observer.(RelayBatchStarter); ok && started == nil {
			started = s.StartRelayBatch(ctx, RelayBatch{Relay: r.config.Name})
			ctx = started
		}
		batch, err := r.fetch(ctx, tx, ids)
		if err != nil || len(batch) > 0 || r.d.claimLocks() {
			return batch, started, err
		}
		// MySQL: other relays hold every row of this prefix; look past
		// it.
		after = ids[len(ids)-1]
	}
	return nil, started, nil
}

// claimWindow returns the ids of the next rows after id after that fit
// MaxBatchBytes (at least one).
func (r *Relay) claimWindow(ctx context.Context, tx sqlstore.Executor, after int64) ([]int64, error) {
	rows, err := tx.Query(ctx, r.d.claim.SQL(), r.d.claim.Args(after, r.config.BatchSize)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	defer rows.Close()
	var ids []int64
	var total int64
	full := false
	for rows.Next() {
		var id, size int64
		if err := rows.Scan(&id, &size); err != nil {
			return nil, fmt.Errorf("outbox: relay: claim: %w", err)
		}
		// Read on to the end: on PostgreSQL every row the query
		// returns is locked anyway, and the result is small.
		if full || (len(ids) > 0 && total+size > int64(r.config.MaxBatchBytes)) {
			full = true
			continue
		}
		ids = append(ids, id)
		total += size
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	return ids, nil
}

// fetch reads the rows ids; on MySQL it also locks them, skipping rows
// locked by others.
func (r *Relay) fetch(ctx context.Context, tx sqlstore.Executor, ids []int64) ([]claimedRow, error) {
	// The rows' ages are taken at the statement's start, and start is a
	// moment on the relay's clock just before it: a row's lag counts no
	// part of the claim twice.
	start := time.Now()
	rows, err := tx.Query(ctx, r.d.fetch.SQL(), r.d.fetch.Args(r.d.ids(ids), start.UnixMicro())...)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: read claimed rows: %w", err)
	}
	defer rows.Close()
	batch := make([]claimedRow, 0, len(ids))
	for rows.Next() {
		var (
			row             claimedRow
			uuid            string
			payload, mdJSON []byte
			ageMicros       int64
		)
		if err := rows.Scan(&row.id, &row.topic, &uuid, &payload, &mdJSON, &row.attempts, &ageMicros); err != nil {
			return nil, fmt.Errorf("outbox: relay: scan: %w", err)
		}
		row.created = start.Add(-microseconds(ageMicros))
		row.msg = message.NewMessage(uuid, payload)
		// A publisher that honours the message's context gives up when
		// the batch is abandoned (ctx ends, Close times out).
		row.msg.SetContext(ctx)
		if len(mdJSON) > 0 {
			if err := json.Unmarshal(mdJSON, &row.msg.Metadata); err != nil {
				// It can never be published: dead-letter it at once
				// rather than block the outbox or skip it silently.
				row.undecodable = fmt.Errorf("outbox: relay: row %d: metadata is not a JSON object of strings: %w", row.id, err)
			}
			if row.msg.Metadata == nil {
				row.msg.Metadata = message.Metadata{}
			}
		}
		batch = append(batch, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: relay: read claimed rows: %w", err)
	}
	slices.SortFunc(batch, func(a, b claimedRow) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}
