package pgxinbox_test

import (
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/middleware/pgxinbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// TestApplyIfNewer: on the pgx inbox, an older version than the applied
// one is stale (the handler's write is skipped, the marker commits), a
// newer one applies, and outside the handler there is no transaction.
func TestApplyIfNewer(t *testing.T) {
	pool := schemaPool(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE prices (sku TEXT PRIMARY KEY, price INTEGER NOT NULL)`)
	require.NoError(t, err)
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	versions, err := postgres.NewPgxVersionStore(pool, postgres.VersionConfig{})
	require.NoError(t, err)
	require.NoError(t, versions.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(middleware.Config{Beginner: pgxinbox.Beginner(pool, repo, pgx.TxOptions{}), Consumer: "catalog"})
	require.NoError(t, err)

	type priceSet struct {
		SKU     string `json:"sku"`
		Price   int    `json:"price"`
		Version int64  `json:"version"`
	}
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var p priceSet
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return nil, err
		}
		if err := pgxinbox.ApplyIfNewer(msg.Context(), versions, p.SKU, p.Version); err != nil {
			return nil, err
		}
		tx, _ := pgxinbox.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO prices (sku, price) VALUES ($1, $2)
ON CONFLICT (sku) DO UPDATE SET price = excluded.price`, p.SKU, p.Price)
		return nil, err
	})
	for i, p := range []priceSet{{"sku-1", 20, 2}, {"sku-1", 10, 1}, {"sku-1", 30, 3}} {
		payload, err := json.Marshal(p)
		require.NoError(t, err)
		_, err = handler(message.NewMessage(string(rune('a'+i)), payload))
		require.NoError(t, err, "version %d", p.Version)
	}
	var price int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT price FROM prices WHERE sku = 'sku-1'`).Scan(&price))
	require.Equal(t, 30, price, "version 1 arrived after 2 and was skipped; 3 applied")
	last, err := versions.LastVersion(t.Context(), "catalog", "sku-1")
	require.NoError(t, err)
	require.EqualValues(t, 3, last)

	require.ErrorIs(t, pgxinbox.ApplyIfNewer(t.Context(), versions, "sku-1", 4), middleware.ErrNoTransaction)
}
