package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS environment variable and its default.
const (
	NATSEnv     = "NATS_URL"
	NATSDefault = "nats://127.0.0.1:4222"
)

// NATSURL returns the NATS URL tests use.
func NATSURL() string { return getenv(NATSEnv, NATSDefault) }

// NATS checks that a NATS server with JetStream enabled answers at NATSURL
// and returns the URL. When it does not, t is skipped with a message naming
// the service, or fails under CI=true. Tests share the server: give
// streams and consumers names no other test uses, and delete them when t
// ends.
func NATS(t testing.TB) string {
	t.Helper()
	url := NATSURL()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err == nil {
		defer nc.Close()
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = js.AccountInfo(ctx) // fails when JetStream is not enabled
		}
	}
	if err != nil {
		missingAt(t, "NATS with JetStream", NATSEnv, url, err)
	}
	return url
}
