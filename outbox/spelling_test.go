package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// uuidRecorder is a publisher that keeps the UUIDs it was given.
type uuidRecorder struct {
	mu    sync.Mutex
	uuids []string
}

func (r *uuidRecorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.uuids = append(r.uuids, m.UUID)
	}
	return nil
}

func (r *uuidRecorder) Close() error { return nil }

func TestDeadLetterTableNameLeavesTheSchemaOutOfTheHash(t *testing.T) {
	long := strings.Repeat("a", 55)
	require.Equal(t, "public."+outbox.DeadLetterTableName(long), outbox.DeadLetterTableName("public."+long))
	require.Equal(t, "public.orders_dead_letters", outbox.DeadLetterTableName("public.orders"))
}

// TestOutboxTableSpelledTwoWays migrates a long-named outbox table as
// "t" and runs the relay and the dead-letter API on it as "public.t":
// the relay publishes the good row and moves the undecodable one into
// the one dead-letter table both spellings name.
//
// The NOTIFY channel is the table name as written, baked into the
// trigger by the first Migrate (and by 0.1.0's): a relay configured with
// another spelling listens on another channel, is never woken, and
// forwards by polling alone (every PollInterval) — late, never lost.
// The test pins that the channel follows the spelling Migrate used.
func TestOutboxTableSpelledTwoWays(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	table := "ob_spelled_" + strings.Repeat("x", 40) + randomSuffix()
	other := "public." + table
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`", "`+outbox.DeadLetterTableName(table)+`"`)
		require.NoError(t, err)
	})
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(ctx, db))

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: message.NewMessage("good", []byte("1"))}))
	require.NoError(t, tx.Commit())
	_, err = db.ExecContext(ctx, `INSERT INTO "`+table+`" (topic, uuid, payload, metadata) VALUES ('t', 'bad', '\x00', '[1]')`)
	require.NoError(t, err)

	pub := &uuidRecorder{}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: other})
	require.NoError(t, err)
	n, err := relay.ForwardBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"good"}, pub.uuids)

	dl, err := outbox.NewDeadLetters(db, outbox.Config{Dialect: sqldialect.PostgreSQL, Table: table})
	require.NoError(t, err)
	dead, err := dl.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, dead, "the relay on %q dead-lettered into the table Migrate on %q made", other, table)

	var channel string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT convert_from(rtrim(tgargs, '\x00'::bytea), 'UTF8') FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`,
		`"`+table+`"`).Scan(&channel))
	same, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.Equal(t, channel, same.NotifyChannel(), "the trigger notifies the channel of the spelling Migrate used")
	require.NotEqual(t, channel, relay.NotifyChannel(), "another spelling listens elsewhere: polling only")
}
