package tracing_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/tracing"
)

// An inbox with metrics and tracing: idempotency.Observers gives it both.
// Each delivery gets a span, and the handler's own spans nest under it.
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	repo, _ := sqlite.NewRepository(db, sqlite.Config{})
	_ = repo.Migrate(context.Background())

	// In production tp is the SDK's provider, e.g.
	// sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter)), and
	// counts is metrics.Metrics; here a recorder lists the spans.
	tp := tracetest.NewRecorder()
	counts := outcomeCounts{}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing",
		Observer: idempotency.Observers(counts, tracing.New(tp)),
	})
	if err != nil {
		panic(err)
	}
	charge := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, span := tp.Tracer("billing").Start(msg.Context(), "charge card")
		defer span.End()
		return nil, nil
	})
	for range 2 {
		if _, err := charge(message.NewMessage("order-1", []byte(`{}`))); err != nil {
			panic(err)
		}
	}

	spans := tp.Ended()
	names := map[[8]byte]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	for _, s := range spans {
		if parent := names[s.Parent().SpanID()]; parent != "" {
			fmt.Printf("%s (in %s)\n", s.Name(), parent)
			continue
		}
		attrs := attribute.NewSet(s.Attributes()...)
		outcome, _ := attrs.Value("idempotency.outcome")
		fmt.Printf("%s: %s\n", s.Name(), outcome.String())
	}
	fmt.Println("counted:", counts)
	// Output:
	// charge card (in inbox billing)
	// inbox billing: processed
	// inbox billing: duplicate
	// counted: map[duplicate:1 processed:1]
}

// outcomeCounts counts deliveries by outcome, a stand-in for
// metrics.Metrics (not safe for concurrent use).
type outcomeCounts map[idempotency.Outcome]int

func (c outcomeCounts) ObserveDelivery(_ context.Context, d idempotency.Delivery) { c[d.Outcome]++ }
