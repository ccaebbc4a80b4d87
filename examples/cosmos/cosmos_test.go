package cosmos_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/cosmos"
	"github.com/idemkit/watermill-idempotent/examples/internal/ledger"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

func container(t *testing.T) cosmos.Postgres {
	db, _ := testenv.PostgresSchema(t, "excosmos_")
	c := cosmos.Postgres{DB: db}
	require.NoError(t, c.Migrate(t.Context()))
	return c
}

func TestApply(t *testing.T) {
	c, ctx := container(t), t.Context()
	require.NoError(t, cosmos.Apply(ctx, c, "order-1", []byte(`{"id":"order-1","cents":100}`)))
	err := cosmos.Apply(ctx, c, "order-1", []byte(`{"id":"order-1","cents":100}`))
	require.ErrorIs(t, err, middleware.ErrNaturalDuplicate, "a copy: same id, same payload")
	err = cosmos.Apply(ctx, c, "order-1", []byte(`{"id":"order-1","cents":999}`))
	require.ErrorIs(t, err, idempotency.ErrPayloadMismatch, "the id reused for other content")
	require.True(t, idempotency.IsPermanent(err))

	stored, err := c.Read(ctx, "order-1")
	require.NoError(t, err)
	var doc cosmos.Document
	require.NoError(t, json.Unmarshal(stored, &doc))
	require.JSONEq(t, `{"id":"order-1","cents":100}`, string(doc.Body), "the first payload stays")
	require.Len(t, doc.PayloadHash, 64)
}

// TestApplyRace applies one message from 8 goroutines at once: the
// primary key lets exactly one create the document, the others see a
// duplicate.
func TestApplyRace(t *testing.T) {
	c, ctx := container(t), t.Context()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = cosmos.Apply(ctx, c, "order-7", []byte(`{"id":"order-7"}`)) })
	}
	wg.Wait()
	created := 0
	for _, err := range errs {
		if err == nil {
			created++
			continue
		}
		require.ErrorIs(t, err, middleware.ErrNaturalDuplicate)
	}
	require.Equal(t, 1, created)
}

// TestRouter runs the handler in a router behind NaturalKey and the
// poison queue: order-1, a copy of it under a new UUID (a producer that
// re-sent it), order-1 with other content, and order-2. Two documents are
// created, the copy is acknowledged as a duplicate, and the reused id
// goes to the poison topic.
func TestRouter(t *testing.T) {
	c := container(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Each Publish waits for its delivery's ack, so the four arrive in
	// order: which copy of order-1 creates the document decides which
	// one is the mismatch.
	pubsub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer pubsub.Close()
	poisoned := &ledger.Topic{}
	poison, err := wmiddleware.PoisonQueueWithFilter(poisoned, "orders_poison", idempotency.IsPermanent)
	require.NoError(t, err)
	outcomes := &ledger.Outcomes{}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(poison, middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "shop", Observer: outcomes}).Middleware)
	router.AddConsumerHandler("orders", "orders", pubsub, cosmos.Handler(c, middleware.JSONFieldKey("id")))
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	wg.Go(func() { _ = router.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	<-router.Running()

	for _, payload := range []string{
		`{"id":"order-1","cents":100}`,
		`{"id":"order-1","cents":100}`,
		`{"id":"order-1","cents":999}`,
		`{"id":"order-2","cents":250}`,
	} {
		require.NoError(t, pubsub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(payload))))
	}
	require.NoError(t, outcomes.WaitAcked(ctx, 3))
	require.Eventually(t, func() bool { return len(poisoned.Messages()) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 2, outcomes.Count(idempotency.OutcomeProcessed))
	require.Equal(t, 1, outcomes.Count(idempotency.OutcomeDuplicate))
	require.JSONEq(t, `{"id":"order-1","cents":999}`, string(poisoned.Messages()[0].Payload))
	var docs int
	require.NoError(t, c.DB.QueryRowContext(ctx, `SELECT count(*) FROM documents`).Scan(&docs))
	require.Equal(t, 2, docs)
}
