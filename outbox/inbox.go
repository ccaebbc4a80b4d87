package outbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Outputs returns an OutputWriter (a middleware.OutputWriter) that stores an inbox handler's
// output messages in this outbox, bound for topic, inside the inbox
// transaction:
//
//	inbox, _ := middleware.NewInbox(middleware.Config{
//		DB: db, Repository: repo, Consumer: "shop",
//		Outputs: ob.Outputs("payments"),
//	})
//
// The business writes, the inbox marker and the outbox rows then commit or
// roll back together, and the relay publishes the outputs with the
// deterministic UUIDs the inbox gave them (middleware.OutputUUID of the
// handler's scope and key). It needs the inbox's Config.DB; for an inbox
// on pgx (pgxinbox.Beginner) use pgxoutbox.Outputs.
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

// WriteOutputs writes msgs in tx, the inbox transaction (see WriteTx).
func (w OutputWriter) WriteOutputs(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
	if tx == nil {
		return errors.New("outbox: the inbox has no *sql.Tx (it runs on a Config.Beginner): use pgxoutbox.Outputs")
	}
	out := make([]Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = Outgoing{Topic: w.topic, Message: m}
	}
	return w.outbox.WriteTx(ctx, tx, out...)
}
