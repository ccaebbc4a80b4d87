package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// natsServer checks that a NATS server with JetStream enabled answers at
// $NATS_URL (default broker.DefaultNATSURL) and returns the URL. When it
// does not, t is skipped with a message naming the service, or fails under
// CI=true. The probe lives here rather than in internal/testsupport/testenv so that
// the library's module does not require the NATS client: only this
// scenario uses NATS. Tests share the server: give
// streams and consumers names no other test uses, and delete them when t
// ends.
func natsServer(t testing.TB) string {
	t.Helper()
	url := os.Getenv(broker.NATSURLEnv)
	if url == "" {
		url = broker.DefaultNATSURL
	}
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
		testenv.MissingAt(t, "NATS with JetStream", broker.NATSURLEnv, url, err)
	}
	return url
}
