package middleware_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// The business row, the inbox marker and the outbox rows commit or roll
// back together, and outputs get deterministic UUIDs.
func TestInboxWritesOutputsToOutboxInItsTransaction(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		dialect := sqldialect.PostgreSQL
		if s.name == "mysql" {
			dialect = sqldialect.MySQL
		}
		table := randomName("outbox")
		ob, err := outbox.New(outbox.Config{Dialect: dialect, Table: table})
		require.NoError(t, err)
		require.NoError(t, ob.Migrate(t.Context(), s.db))
		t.Cleanup(func() {
			_, err := s.db.Exec(`DROP TABLE IF EXISTS ` + table)
			require.NoError(t, err)
		})
		outboxUUIDs := func() []string {
			rows, err := s.db.Query(`SELECT uuid FROM ` + table + ` ORDER BY id`)
			require.NoError(t, err)
			defer rows.Close()
			var uuids []string
			for rows.Next() {
				var u string
				require.NoError(t, rows.Scan(&u))
				uuids = append(uuids, u)
			}
			require.NoError(t, rows.Err())
			return uuids
		}

		fail := true
		h := &chargeHandler{s: s, before: func(*message.Message, *sql.Tx) error {
			if fail {
				return errors.New("declined")
			}
			return nil
		}}
		mw := s.newInbox(t, "billing", func(c *middleware.Config) { c.Outputs = ob.Outputs("payments") }).Middleware(h.Handle)

		_, err = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.Error(t, err)
		require.Zero(t, s.chargesFor(t, "o-1"), "handler error: no business row")
		_, err = s.repo.Get(t.Context(), "billing", "uuid-1")
		require.ErrorIs(t, err, repository.ErrNotFound, "handler error: no marker")
		require.Empty(t, outboxUUIDs(), "handler error: no outbox row")

		fail = false
		out, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		require.Empty(t, out, "the relay publishes the outputs, not the router")
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
		want := middleware.OutputUUID("billing", "uuid-1", 0)
		require.Equal(t, []string{want}, outboxUUIDs())

		out, err = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		require.Empty(t, out)
		require.Equal(t, []string{want}, outboxUUIDs(), "a duplicate writes nothing more")
		require.EqualValues(t, 2, h.runs.Load())
	}, "postgres", "mysql") // the outbox's dialects
}
