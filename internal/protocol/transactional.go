package protocol

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Tx is a transaction that claims keys and stores results: a DriverTx,
// or the inbox's transaction around one.
type Tx interface {
	SaveResult(ctx context.Context, p repository.SaveResultParams) error
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DriverTx is a transaction Tx of driver D.
type DriverTx[TTx any] struct {
	D  repository.Driver[TTx]
	Tx TTx
}

// SaveResult stores p's result in the transaction.
func (t DriverTx[TTx]) SaveResult(ctx context.Context, p repository.SaveResultParams) error {
	return t.D.SaveResult(ctx, t.Tx, p)
}

// Commit commits.
func (t DriverTx[TTx]) Commit(ctx context.Context) error { return t.D.Commit(ctx, t.Tx) }

// Rollback rolls back; nil once the transaction has ended.
func (t DriverTx[TTx]) Rollback(ctx context.Context) error { return t.D.Rollback(ctx, t.Tx) }

// BeginClaim begins a transaction on d and claims p in it, in one round
// trip where d can.
func BeginClaim[TTx any](ctx context.Context, d repository.Driver[TTx], p repository.ClaimParams) (DriverTx[TTx], repository.Claim, error) {
	tx, claims, err := d.BeginClaim(ctx, []repository.ClaimParams{p})
	if err != nil {
		return DriverTx[TTx]{D: d}, repository.Claim{}, err
	}
	return DriverTx[TTx]{d, tx}, claims[0], nil
}

// Transactional runs the protocol in one transaction per call: the
// claim, the function's writes and its result commit together or not at
// all.
//
// The transaction is not bound to the call's context: database/sql would
// roll it back on its own when that context is cancelled (a subscriber
// shutting down), racing the commit and leaving its outcome unknown.
// Statements still run with the context and fail once it is cancelled;
// the commit alone decides.
type Transactional[T Tx] struct {
	// Prefix starts every error ("inbox", "once").
	Prefix string
	// BeginClaim begins the transaction and claims the key (see
	// repository.Driver's BeginClaim); on an error it has ended.
	BeginClaim func(ctx context.Context, p repository.ClaimParams) (T, repository.Claim, error)
}

// Run claims p's key in a new transaction and, on a fresh claim, runs fn
// in it, stores the result fn returns (nil: none) and commits. A
// duplicate is answered with Duplicate. fn's error or panic, a failed
// store or commit roll everything back. A panic of fn is recovered and
// returned in Answer.Panic (with an error in Err), so that the entry
// point reports the call like any other before it re-raises the panic.
func (t Transactional[T]) Run(ctx context.Context, p repository.ClaimParams, fn func(ctx context.Context, tx T) ([]byte, error)) Answer {
	tx, claim, took, err := t.claim(ctx, p)
	if err != nil {
		return Answer{Kind: Unclaimed, Err: err, Claim: took}
	}
	committed := false
	defer func() {
		if !committed && any(tx) != nil {
			// Covers errors and panics alike: nothing of this call stays.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if !claim.Claimed {
		a := Duplicate(p.Consumer, p.Key, p.PayloadHash, claim.Existing)
		a.Claim = took
		return a
	}
	result, panicked, err := t.runFn(ctx, tx, fn)
	if panicked != nil {
		return Answer{Kind: Ran, Err: err, Panic: panicked, Claim: took}
	}
	if err == nil {
		// The function's work is done: finish the bookkeeping even if the
		// call is being cancelled, rather than throw that work away.
		err = t.Save(context.WithoutCancel(ctx), tx, p.Consumer, p.Key, result)
	}
	if err == nil {
		if err = tx.Commit(context.WithoutCancel(ctx)); err != nil {
			err = fmt.Errorf("%s: commit key %q: %w", t.Prefix, p.Key, err)
		}
	}
	committed = err == nil
	return Answer{Kind: Ran, Err: err, Claim: took, Result: result}
}

// runFn runs fn on tx, recovering its panic: the deferred rollback in Run
// then ends the transaction, and Run answers.
func (t Transactional[T]) runFn(ctx context.Context, tx T, fn func(ctx context.Context, tx T) ([]byte, error)) (result []byte, panicked any, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked, err = r, fmt.Errorf("%s: handler panicked: %v", t.Prefix, r)
		}
	}()
	result, err = fn(ctx, tx)
	return result, nil, err
}

// Save stores result as the key's result in tx; nil stores nothing.
func (t Transactional[T]) Save(ctx context.Context, tx T, scope, key string, result []byte) error {
	if result == nil {
		return nil
	}
	if err := tx.SaveResult(ctx, repository.SaveResultParams{Consumer: scope, Key: key, Result: result}); err != nil {
		return fmt.Errorf("%s: store result of key %q: %w", t.Prefix, key, err)
	}
	return nil
}

// claim begins the transaction and claims the key with BeginClaim. took
// is the claim's time (with BEGIN where the two share a round trip).
func (t Transactional[T]) claim(ctx context.Context, p repository.ClaimParams) (tx T, claim repository.Claim, took time.Duration, err error) {
	start := time.Now()
	tx, claim, err = t.BeginClaim(ctx, p)
	if took = time.Since(start); err != nil {
		return tx, claim, took, fmt.Errorf("%s: claim key %q: %w", t.Prefix, p.Key, err)
	}
	return tx, claim, took, nil
}
