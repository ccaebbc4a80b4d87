package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ErrNotDurable is returned (wrapped, with how many replicas acknowledged
// out of how many were required) by a state change of a Repository with
// Config.DurableWrites when fewer replicas acknowledged it within
// Config.DurableTimeout, or when the WAIT for them failed.
//
// The write itself happened: the record's primary has it, and the
// replicas that were reached may have it too. It survives unless the
// primary fails before a replica that has it is promoted. Treat the call
// as failed and retryable, as after a lost answer: an Acquire or Reclaim
// that returns it holds the lease on the primary (release it, fenced by
// the owner, or let it expire — the inbox middleware releases it); a
// Complete that returns it left the record completed on the primary, and
// retrying the Complete then finds it so (repository.ErrLeaseLost).
var ErrNotDurable = errors.New("write not acknowledged by enough replicas")

// maxDurableRedirects bounds how often a durable write on a
// ClusterClient is sent again after a MOVED reply (the slot moved to
// another primary) or a primary that could not be dialed, before giving
// up.
const maxDurableRedirects = 3

// primaryFinder returns how to find the client of the primary that holds
// a key, for the clients whose nodes go-redis exposes.
func primaryFinder(client goredis.UniversalClient) (func(context.Context, string) (*goredis.Client, error), error) {
	switch c := client.(type) {
	case *goredis.Client:
		return func(context.Context, string) (*goredis.Client, error) { return c, nil }, nil
	case *goredis.ClusterClient:
		return c.MasterForKey, nil
	case *goredis.Ring:
		return func(_ context.Context, key string) (*goredis.Client, error) { return c.GetShardClientForKey(key) }, nil
	}
	return nil, fmt.Errorf("a %T cannot pin WAIT to a write's connection: use a *redis.Client, *redis.ClusterClient or *redis.Ring", client)
}

// replyIsOne reports whether a script that answers 1 for a change
// changed the record.
func replyIsOne(v any) bool { n, ok := v.(int64); return ok && n == 1 }

// replyIsRecord reports whether a script that answers the changed record
// (and 0 for no change) changed it.
func replyIsRecord(v any) bool { _, isInt := v.(int64); return !isInt }

// run runs s on the record at key and returns its reply. With
// DurableWrites, when changed reports that the script changed the record,
// WAIT follows.
func (r *Repository) run(ctx context.Context, s *goredis.Script, key string, changed func(any) bool, args ...any) (any, error) {
	if r.durable == 0 {
		return s.Run(ctx, r.client, []string{key}, args...).Result()
	}
	for redirects := 0; ; redirects++ {
		v, err := r.runDurable(ctx, s, key, changed, args)
		if err == nil || errors.Is(err, ErrNotDurable) {
			return v, err
		}
		cluster, isCluster := r.client.(*goredis.ClusterClient)
		if !isCluster {
			return nil, err
		}
		// The script went past the ClusterClient, which therefore did not
		// see the error: a MOVED (the slot has a new primary) or a dead
		// node must make it read the slots again. Neither ran the script,
		// so it can be sent again once the slots are read.
		cluster.ReloadState(ctx)
		_, moved := goredis.IsMovedError(err)
		var netErr *net.OpError
		notDialed := errors.As(err, &netErr) && netErr.Op == "dial"
		if !moved && !notDialed || redirects >= maxDurableRedirects {
			return nil, err
		}
		// The reload runs in the background: give it a moment.
		t := time.NewTimer(time.Duration(redirects+1) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (after %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// runDurable runs s and then WAIT on one connection to the key's
// primary: WAIT counts the replicas that have the latest write of its
// own connection, so both must share it (a ClusterClient pipeline would
// send the keyless WAIT to any primary, and a MULTI makes WAIT return
// without waiting).
func (r *Repository) runDurable(ctx context.Context, s *goredis.Script, key string, changed func(any) bool, args []any) (any, error) {
	primary, err := r.primaryFor(ctx, key)
	if err != nil {
		return nil, err
	}
	conn := primary.Conn()
	defer func() { _ = conn.Close() }()
	v, err := s.Run(ctx, conn, []string{key}, args...).Result()
	if err != nil || !changed(v) {
		return v, err
	}
	acked, err := conn.Wait(ctx, r.durable, r.durableTimeout).Result()
	if err != nil {
		return v, fmt.Errorf("%w: WAIT for %d replicas failed: %w", ErrNotDurable, r.durable, err)
	}
	if acked < int64(r.durable) {
		return v, fmt.Errorf("%w: %d of %d replicas acknowledged within %s", ErrNotDurable, acked, r.durable, r.durableTimeout)
	}
	return v, nil
}
