package robustness

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// This file is the suite's only contact with the backends' constructors;
// the servers they talk to, and the faults, are in instances.go.

// Backend is a store under test and the faults the suite injects into it.
type Backend struct {
	Name  string
	Store Store
	// Tx is the transactional contract, on SQL backends only.
	Tx     *TxStore
	Faults []Fault
	closes []func()
}

// Close releases the store and stops and removes the backend's private
// server, if any.
func (b *Backend) Close() {
	for i := len(b.closes) - 1; i >= 0; i-- {
		b.closes[i]()
	}
}

// BackendNames are the backends Run knows, in the order it runs them.
// "broken" is not among them: it is the store the suite must catch.
var BackendNames = []string{"memory", "sqlite", "postgres", "mariadb", "redis", "redis-aof", "redis-aof-noretry"}

// OpenBackend opens the named backend on a fresh table (or key prefix),
// starting its private server when it has one. A missing service or tool
// is an error wrapping ErrMissing.
func OpenBackend(ctx context.Context, name string) (*Backend, error) {
	b := &Backend{Name: name, Faults: []Fault{{Name: "none"}}}
	table := "robust_" + randomHex()
	var err error
	switch name {
	case "memory":
		b.Store = memory.NewRepository()
	case "broken":
		b.Store = newCheckThenSet()
	case "sqlite":
		var dir string
		if dir, err = tempDir(b); err == nil {
			var db *sql.DB
			if db, err = sqlite.Open(filepath.Join(dir, "robust.db")); err == nil {
				b.closes = append(b.closes, func() { _ = db.Close() })
				var r *sqlite.Repository
				if r, err = sqlite.NewRepository(db, sqlite.Config{Table: table}); err == nil {
					b.Store, b.Tx, err = r, &TxStore{DB: db, Repo: r}, r.Migrate(ctx)
				}
			}
		}
	case "postgres":
		var pg *privatePostgres
		if pg, err = startPostgres(ctx, b); err == nil {
			var r *postgres.Repository[*sql.Tx]
			if r, err = postgres.NewRepository(pg.store, postgres.Config{Table: table}); err == nil {
				b.Store, b.Tx, err = r, &TxStore{DB: pg.store, Repo: r}, r.Migrate(ctx)
			}
			b.Faults = append(b.Faults, pg.faults()...)
		}
	case "mariadb":
		var my *sharedMariaDB
		if my, err = openMariaDB(ctx, b); err == nil {
			var r *mysql.Repository
			if r, err = mysql.NewRepository(my.store, mysql.Config{Table: table}); err == nil {
				b.Store, b.Tx, err = r, &TxStore{DB: my.store, Repo: r}, r.Migrate(ctx)
			}
			b.Faults = append(b.Faults, my.faults()...)
		}
	case "redis", "redis-aof", "redis-aof-noretry":
		var rs *privateRedis
		if rs, err = startRedis(ctx, b, name != "redis"); err == nil {
			opts := &goredis.Options{Addr: rs.addr}
			if name == "redis-aof-noretry" {
				// go-redis retries a command whose connection broke
				// (MaxRetries 3 by default), even a script that ran: the
				// retry answers for the second run. -1 turns retries off,
				// so a broken connection is an unknown outcome instead.
				opts.MaxRetries = -1
			}
			client := goredis.NewClient(opts)
			b.closes = append(b.closes, func() { _ = client.Close() })
			b.Store, err = redis.NewRepository(client, redis.Config{KeyPrefix: table + ":"})
			b.Faults = append(b.Faults, rs.faults()...)
		}
	default:
		err = fmt.Errorf("robustness: unknown backend %q", name)
	}
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}
