package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/stdlib"
)

// errNoPgx means LISTEN is impossible with this *sql.DB; retrying is
// pointless.
var errNoPgx = errors.New("LISTEN/NOTIFY needs the pgx/v5 stdlib driver")

// listen holds one connection of db in LISTEN on the outbox's channel and
// signals wake for every notification, and once after every (re)connect
// to catch up on commits it may have missed. It returns when ctx ends.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	fields := watermill.LogFields{"channel": r.d.channel}
	for {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoPgx) {
			r.logger.Info("Outbox relay: "+err.Error()+"; polling only", fields.Add(watermill.LogFields{"poll_interval": r.config.PollInterval}))
			return
		}
		r.logger.Error("Outbox relay: LISTEN connection lost, polling until it is back", err, fields)
		t := time.NewTimer(defaultListenRetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: relay: listen: %w", err)
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w (driver connection is %T)", errNoPgx, dc)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN "`+r.d.channel+`"`); err != nil {
			// The connection may be mid-protocol; never return it to the pool.
			return fmt.Errorf("outbox: relay: LISTEN: %w: %w", err, driver.ErrBadConn)
		}
		signal(wake)
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				// A listening connection must not go back to the pool:
				// ErrBadConn makes database/sql close it.
				return fmt.Errorf("outbox: relay: wait for notification: %w: %w", err, driver.ErrBadConn)
			}
			signal(wake)
		}
	})
}

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
