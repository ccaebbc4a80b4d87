package tracetest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
)

// TestRecorderParentsAndTraces: a span started under a local or an
// extracted remote span context is its child in the same trace; one
// started without, or as a new root, begins a trace of its own.
func TestRecorderParentsAndTraces(t *testing.T) {
	tp := tracetest.NewRecorder()
	tr := tp.Tracer("test")
	ctx, root := tr.Start(context.Background(), "root")
	_, child := tr.Start(ctx, "child")
	_, newRoot := tr.Start(ctx, "new root", trace.WithNewRoot())

	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	remote := propagation.TraceContext{}.Extract(context.Background(), carrier)
	_, fromRemote := tr.Start(remote, "from remote", trace.WithSpanKind(trace.SpanKindConsumer))
	for _, s := range []trace.Span{fromRemote, newRoot, child, root} {
		s.End()
	}

	spans := tp.Ended()
	require.Len(t, spans, 4)
	gotRemote, gotNewRoot, gotChild, gotRoot := spans[0], spans[1], spans[2], spans[3]
	require.True(t, gotRoot.SpanContext().IsValid())
	require.True(t, gotRoot.SpanContext().IsSampled())
	require.False(t, gotRoot.Parent().IsValid())
	require.Equal(t, gotRoot.SpanContext().TraceID(), gotChild.SpanContext().TraceID())
	require.Equal(t, gotRoot.SpanContext().SpanID(), gotChild.Parent().SpanID())
	require.NotEqual(t, gotRoot.SpanContext().SpanID(), gotChild.SpanContext().SpanID())
	require.False(t, gotNewRoot.Parent().IsValid())
	require.NotEqual(t, gotRoot.SpanContext().TraceID(), gotNewRoot.SpanContext().TraceID())
	require.Equal(t, gotRoot.SpanContext().TraceID(), gotRemote.SpanContext().TraceID())
	require.Equal(t, gotRoot.SpanContext().SpanID(), gotRemote.Parent().SpanID())
	require.True(t, gotRemote.Parent().IsRemote())
	require.Equal(t, trace.SpanKindConsumer, gotRemote.SpanKind())
	require.Equal(t, trace.SpanKindUnspecified, gotRoot.SpanKind())
	require.Equal(t, []string{"from remote", "new root", "child", "root"},
		[]string{gotRemote.Name(), gotNewRoot.Name(), gotChild.Name(), gotRoot.Name()})
}

// TestSpanRecordsWhatIsSetUntilItEnds: attributes (the last value of a
// key wins), events, errors and status are kept with the SDK's rules, and
// nothing changes a span once it has ended.
func TestSpanRecordsWhatIsSetUntilItEnds(t *testing.T) {
	tp := tracetest.NewRecorder()
	_, s := tp.Tracer("test").Start(context.Background(), "s", trace.WithAttributes(attribute.String("a", "1")))
	require.True(t, s.IsRecording())
	s.SetAttributes(attribute.String("b", "2"), attribute.String("a", "3"))
	s.RecordError(nil)
	s.RecordError(errors.New("boom"))
	s.SetStatus(codes.Error, "failed")
	s.SetStatus(codes.Unset, "")
	s.SetName("renamed")
	require.Empty(t, tp.Ended(), "not ended yet")
	s.End()
	require.False(t, s.IsRecording())
	s.SetAttributes(attribute.String("late", "x"))
	s.SetStatus(codes.Ok, "")
	s.SetName("late")
	s.End()

	spans := tp.Ended()
	require.Len(t, spans, 1, "a second End records nothing")
	got := spans[0]
	require.Equal(t, "renamed", got.Name())
	require.Equal(t, []attribute.KeyValue{attribute.String("a", "3"), attribute.String("b", "2")}, got.Attributes())
	require.Equal(t, tracetest.Status{Code: codes.Error, Description: "failed"}, got.Status())
	events := got.Events()
	require.Len(t, events, 1)
	require.Equal(t, "exception", events[0].Name)
	require.Contains(t, events[0].Attributes, attribute.String("exception.message", "boom"))

	_, ok := tp.Tracer("test").Start(context.Background(), "ok")
	ok.SetStatus(codes.Ok, "ignored")
	ok.SetStatus(codes.Error, "too late")
	ok.End()
	require.Equal(t, tracetest.Status{Code: codes.Ok}, tp.Ended()[1].Status(), "Ok is final")
}
