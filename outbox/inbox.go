package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// Outputs returns an OutputWriter (a middleware.OutputWriter) that stores an inbox handler's
// output messages in this outbox, bound for topic, inside the inbox
// transaction:
//
//	inbox, _ := middleware.NewInbox(repo, middleware.Config{
//		Consumer: "shop",
//		Outputs:  ob.Outputs("payments"),
//	})
//
// The business writes, the inbox marker and the outbox rows then commit or
// roll back together, and the relay publishes the outputs with the
// deterministic UUIDs the inbox gave them (middleware.OutputUUID of the
// handler's scope and key). It needs an inbox on database/sql (a
// *sql.Tx); for an inbox on pgx (postgres.NewPgxRepository) use
// pgxoutbox.Outputs.
func (o *Outbox) Outputs(topic string) OutputWriter {
	return OutputWriter{outbox: o, topic: topic}
}

// OutputWriter writes an inbox handler's outputs into an outbox, bound
// for one topic; Outbox.Outputs makes one. It satisfies
// middleware.OutputWriter (the outbox does not import the middleware).
type OutputWriter struct {
	outbox *Outbox
	topic  string
}

// WriteOutputs writes msgs in the inbox transaction ctx carries (see
// WriteTx).
func (w OutputWriter) WriteOutputs(ctx context.Context, msgs []*message.Message) error {
	tx, err := idempotency.Tx[*sql.Tx](ctx)
	if err != nil {
		return fmt.Errorf("outbox: write outputs: %w (on pgx, use pgxoutbox.Outputs)", err)
	}
	out := make([]Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = Outgoing{Topic: w.topic, Message: m}
	}
	return w.outbox.WriteTx(ctx, tx, out...)
}
