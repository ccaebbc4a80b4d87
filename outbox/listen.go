package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// NotifyChannel is the channel the shipped PostgreSQL trigger of this
// relay's table sends NOTIFY on (the table name, or a prefix of a long
// one with a hash of it); the relay passes it to RelayConfig.Notifier.
func (r *Relay) NotifyChannel() string { return r.d.channel }

// listen keeps the Notifier listening and signals wake for every
// notification, reconnecting after a pause when it fails. It returns
// when ctx ends.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	fields := watermill.LogFields{"channel": r.d.channel}
	notified := func() { signal(wake) }
	for {
		err := r.config.Notifier.Listen(ctx, r.d.channel, notified)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errors.ErrUnsupported) {
			r.logger.Info("Outbox relay: cannot LISTEN ("+err.Error()+"); polling only", fields.Add(watermill.LogFields{"poll_interval": r.config.PollInterval}))
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

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
