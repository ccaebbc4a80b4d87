// Package tracetest records the spans a component starts, for tests that
// check its OpenTelemetry instrumentation. It is built on the trace API
// alone, so the library's module needs no OpenTelemetry SDK: the SDK's
// own recorder (go.opentelemetry.io/otel/sdk/trace/tracetest) would put
// the SDK in every user's go.sum for the sake of our tests.
//
//	tp := tracetest.NewRecorder()
//	inbox, err := middleware.NewInbox(middleware.Config{…, Observer: tracing.New(tp)})
//	…
//	for _, s := range tp.Ended() { s.Name(), s.Attributes(), s.Parent() … }
//
// A Recorder samples everything: every span is recording and sampled. As
// with the SDK, a span started in a context that carries a valid span
// context (local, or extracted from a carrier) is its child in the same
// trace, and a span without one starts a new trace. Span exposes the accessors of the SDK's ReadOnlySpan that
// tests read, with the same names and meanings.
package tracetest

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Recorder is a trace.TracerProvider that keeps every span its tracers
// start. It is safe for concurrent use.
type Recorder struct {
	embedded.TracerProvider

	mu    sync.Mutex
	ended []*Span
}

// NewRecorder returns a Recorder with no spans.
func NewRecorder() *Recorder { return &Recorder{} }

// Tracer returns a tracer whose spans r records; name and options are
// ignored.
func (r *Recorder) Tracer(string, ...trace.TracerOption) trace.Tracer { return tracer{r: r} }

// Ended returns the spans ended so far, in the order they ended.
func (r *Recorder) Ended() []*Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Span(nil), r.ended...)
}

type tracer struct {
	embedded.Tracer
	r *Recorder
}

// Start starts a recording span, a child of the span context in ctx
// unless there is none or the options ask for a new root.
func (t tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	var parent trace.SpanContext
	if !cfg.NewRoot() {
		parent = trace.SpanContextFromContext(ctx)
	}
	sc := trace.SpanContextConfig{TraceID: parent.TraceID(), TraceFlags: trace.FlagsSampled, TraceState: parent.TraceState()}
	if !parent.IsValid() {
		parent = trace.SpanContext{}
		sc.TraceState = trace.TraceState{}
		_, _ = rand.Read(sc.TraceID[:]) // never fails (crypto/rand, Go 1.24+)
	}
	_, _ = rand.Read(sc.SpanID[:])
	s := &Span{
		r:          t.r,
		name:       name,
		kind:       cfg.SpanKind(),
		sc:         trace.NewSpanContext(sc),
		parent:     parent,
		attributes: append([]attribute.KeyValue(nil), cfg.Attributes()...),
		links:      append([]trace.Link(nil), cfg.Links()...),
	}
	return trace.ContextWithSpan(ctx, s), s
}

// Status is a span's status, as the SDK's ReadOnlySpan reports it.
type Status struct {
	Code        codes.Code
	Description string
}

// Event is an event added to a span (AddEvent, RecordError).
type Event struct {
	Name       string
	Attributes []attribute.KeyValue
}

// Span is a recorded span. Its setters are those of trace.Span and have
// no effect once the span has ended; its accessors may be read at any
// time.
type Span struct {
	embedded.Span
	r      *Recorder
	sc     trace.SpanContext
	parent trace.SpanContext
	kind   trace.SpanKind

	mu         sync.Mutex
	ended      bool
	name       string
	attributes []attribute.KeyValue
	links      []trace.Link
	events     []Event
	status     Status
}

// End ends s and hands it to the recorder; later calls do nothing.
func (s *Span) End(...trace.SpanEndOption) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.mu.Unlock()
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.r.ended = append(s.r.ended, s)
}

// update runs f under s's lock unless s has ended.
func (s *Span) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		f()
	}
}

// AddEvent records an event with the options' attributes.
func (s *Span) AddEvent(name string, opts ...trace.EventOption) {
	cfg := trace.NewEventConfig(opts...)
	s.update(func() { s.events = append(s.events, Event{Name: name, Attributes: cfg.Attributes()}) })
}

// AddLink records a link.
func (s *Span) AddLink(link trace.Link) { s.update(func() { s.links = append(s.links, link) }) }

// IsRecording reports whether s has not ended.
func (s *Span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

// RecordError records an "exception" event with the error's type and
// message, as the SDK does; a nil error records nothing.
func (s *Span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", err.Error()),
	))
	s.AddEvent("exception", opts...)
}

// SpanContext returns s's span context.
func (s *Span) SpanContext() trace.SpanContext { return s.sc }

// SetStatus sets s's status with the SDK's precedence: Ok is final, Error
// replaces Unset, Unset changes nothing; the description is kept for
// Error only.
func (s *Span) SetStatus(code codes.Code, description string) {
	s.update(func() {
		if code < s.status.Code {
			return
		}
		s.status = Status{Code: code}
		if code == codes.Error {
			s.status.Description = description
		}
	})
}

// SetName renames s.
func (s *Span) SetName(name string) { s.update(func() { s.name = name }) }

// SetAttributes adds attributes; a key set again keeps its last value.
func (s *Span) SetAttributes(kv ...attribute.KeyValue) {
	s.update(func() { s.attributes = append(s.attributes, kv...) })
}

// TracerProvider returns the Recorder that started s.
func (s *Span) TracerProvider() trace.TracerProvider { return s.r }

// Name returns s's name.
func (s *Span) Name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.name
}

// SpanKind returns the kind s was started with.
func (s *Span) SpanKind() trace.SpanKind { return s.kind }

// Parent returns the span context of s's parent, invalid for a root.
func (s *Span) Parent() trace.SpanContext { return s.parent }

// Attributes returns s's attributes, one per key (the last value set),
// in the order the keys were first set.
func (s *Span) Attributes() []attribute.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	index := map[attribute.Key]int{}
	var out []attribute.KeyValue
	for _, kv := range s.attributes {
		if i, ok := index[kv.Key]; ok {
			out[i] = kv
			continue
		}
		index[kv.Key] = len(out)
		out = append(out, kv)
	}
	return out
}

// Links returns s's links.
func (s *Span) Links() []trace.Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]trace.Link(nil), s.links...)
}

// Events returns s's events in the order they were added.
func (s *Span) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Status returns s's status.
func (s *Span) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// AttributeStrings returns s's attributes as strings by key (the last
// value set), for comparing a span's attributes in one assertion.
func (s *Span) AttributeStrings() map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value.String()
	}
	return out
}
