package metrics_test

import (
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/tracing"
)

// TestMetricsAndTracing: one inbox observed by metrics and tracing
// through idempotency.Observers counts each delivery and gives it a span,
// with the handler's span under it.
func TestMetricsAndTracing(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	tp := tracetest.NewRecorder()

	db, err := sqlite.Open(filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing",
		Observer: idempotency.Observers(m, tracing.New(tp))})
	require.NoError(t, err)

	var handler trace.SpanContext
	mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, span := tp.Tracer("billing").Start(msg.Context(), "charge card")
		handler = span.SpanContext()
		span.End()
		return nil, nil
	})
	for range 2 {
		_, err := mw(message.NewMessage("order-1", []byte(`{}`)))
		require.NoError(t, err)
	}

	require.InDelta(t, 1, testutil.ToFloat64(counter(t, reg, "watermill_idempotent_deliveries_total", "billing", "processed")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(counter(t, reg, "watermill_idempotent_deliveries_total", "billing", "duplicate")), 0)
	var inboxSpans, charge []*tracetest.Span
	for _, s := range tp.Ended() {
		switch s.Name() {
		case "inbox billing":
			inboxSpans = append(inboxSpans, s)
		case "charge card":
			charge = append(charge, s)
		}
	}
	require.Len(t, inboxSpans, 2)
	require.Len(t, charge, 1)
	require.Equal(t, handler, charge[0].SpanContext())
	require.Equal(t, inboxSpans[0].SpanContext().SpanID(), charge[0].Parent().SpanID(), "the handler's span nests under the delivery's")
}
