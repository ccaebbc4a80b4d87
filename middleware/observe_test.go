package middleware_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/tracing"
)

func TestInboxSpansAndLogs(t *testing.T) {
	s := newSQLiteStore(t)
	tp := tracetest.NewRecorder()
	logs := watermill.NewCaptureLogger()

	var handlerSpan trace.SpanContext
	mw := s.newInbox(t, "billing", func(c *middleware.Config) {
		c.Observer = tracing.New(tp)
		c.Logger = logs
	}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
		handlerSpan = trace.SpanContextFromContext(msg.Context())
		return []*message.Message{message.NewMessage("payment-1", []byte("paid"))}, nil
	})

	// The producer's span travels in the message metadata (W3C traceparent).
	_, producer := tp.Tracer("test").Start(context.Background(), "publish order")
	producer.End()
	msg := message.NewMessage("order-1", []byte(`{"card":"4111-secret"}`))
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), producer), metadataCarrierForTest(msg.Metadata))
	wmiddleware.SetCorrelationID("corr-42", msg)

	out, err := mw(msg)
	require.NoError(t, err)
	dup := message.NewMessage("order-1", []byte(`{"card":"4111-secret"}`))
	wmiddleware.SetCorrelationID("corr-42", dup)
	_, err = mw(dup)
	require.NoError(t, err)
	_, err = mw(message.NewMessage("order-1", []byte("other")))
	require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)

	spans := tp.Ended()
	var inbox []*tracetest.Span
	for _, sp := range spans {
		if sp.Name() == "inbox billing" {
			inbox = append(inbox, sp)
		}
	}
	require.Len(t, inbox, 3)
	first := inbox[0]
	require.Equal(t, trace.SpanKindConsumer, first.SpanKind())
	require.Equal(t, producer.SpanContext().TraceID(), first.SpanContext().TraceID(), "child of the incoming trace")
	require.Equal(t, producer.SpanContext().SpanID(), first.Parent().SpanID())
	require.Equal(t, first.SpanContext().SpanID(), handlerSpan.SpanID(), "the handler runs inside the inbox span")
	attrs := first.AttributeStrings()
	require.Equal(t, "billing", attrs["idempotency.consumer"])
	require.Equal(t, "order-1", attrs["idempotency.key"])
	require.Equal(t, "processed", attrs["idempotency.outcome"])
	require.Equal(t, "transactional", attrs["idempotency.mode"])
	require.Equal(t, "replayed", inbox[1].AttributeStrings()["idempotency.outcome"])
	require.Equal(t, "payload_mismatch", inbox[2].AttributeStrings()["idempotency.outcome"])
	require.Equal(t, codes.Error, inbox[2].Status().Code)

	// The output continues the trace downstream.
	outCtx := propagation.TraceContext{}.Extract(context.Background(), metadataCarrierForTest(out[0].Metadata))
	require.Equal(t, producer.SpanContext().TraceID(), trace.SpanContextFromContext(outCtx).TraceID())

	captured := logs.Captured()
	require.True(t, hasLog(captured[watermill.DebugLogLevel], "Inbox: processed", "order-1", "corr-42"))
	require.True(t, hasLog(captured[watermill.InfoLogLevel], "Inbox: duplicate acknowledged without running the handler", "order-1", "corr-42"))
	require.True(t, hasLog(captured[watermill.ErrorLogLevel], "Inbox: delivery refused", "order-1", ""))
	for _, level := range captured {
		for _, m := range level {
			require.NotContains(t, fmt.Sprint(m.Fields, m.Err), "4111-secret", "payloads are never logged")
		}
	}
}

// TestInboxWithoutTracerKeepsTheTrace: without a tracing Observer, or
// with one on a no-op TracerProvider, the inbox starts no span, yet the
// handler's context and the outputs still carry the incoming message's
// trace.
func TestInboxWithoutTracerKeepsTheTrace(t *testing.T) {
	for name, observer := range map[string]idempotency.Observer{
		"no observer":      nil,
		"noop provider":    tracing.New(noop.NewTracerProvider()),
		"another observer": idempotency.Observers(nil, &outcomeCounter{}),
		"nil in a tracer":  idempotency.Observers(tracing.New(noop.NewTracerProvider()), nil),
	} {
		t.Run(name, func(t *testing.T) {
			s := newSQLiteStore(t)
			var handlerSpan trace.SpanContext
			mw := s.newInbox(t, "billing", func(c *middleware.Config) {
				c.Observer = observer
			}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
				handlerSpan = trace.SpanContextFromContext(msg.Context())
				return []*message.Message{message.NewMessage("payment-1", []byte("paid"))}, nil
			})
			traceID, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
			spanID, _ := trace.SpanIDFromHex("b7ad6b7169203331")
			parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
			msg := message.NewMessage("order-1", []byte(`{}`))
			propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), parent), metadataCarrierForTest(msg.Metadata))

			out, err := mw(msg)
			require.NoError(t, err)
			require.Equal(t, traceID, handlerSpan.TraceID(), "the handler sees the message's trace")
			require.Equal(t, spanID, handlerSpan.SpanID(), "in no span of the inbox")
			require.Len(t, out, 1)
			outCtx := propagation.TraceContext{}.Extract(context.Background(), metadataCarrierForTest(out[0].Metadata))
			require.Equal(t, traceID, trace.SpanContextFromContext(outCtx).TraceID(), "the output continues it")

			// A message without a trace context gets none.
			out, err = mw(message.NewMessage("order-2", []byte(`{}`)))
			require.NoError(t, err)
			require.Empty(t, out[0].Metadata.Get("traceparent"))
		})
	}
}

func hasLog(msgs []watermill.CapturedMessage, text, key, correlation string) bool {
	for _, m := range msgs {
		if m.Msg == text && m.Fields["key"] == key && m.Fields["consumer"] == "billing" &&
			m.Fields["message_uuid"] == "order-1" && m.Fields["correlation_id"] == correlation && m.Fields["outcome"] != nil {
			return true
		}
	}
	return false
}

type metadataCarrierForTest message.Metadata

func (c metadataCarrierForTest) Get(key string) string { return c[key] }
func (c metadataCarrierForTest) Set(key, value string) { c[key] = value }
func (c metadataCarrierForTest) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
