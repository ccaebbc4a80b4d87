package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// The partitioned inbox of RunSurfaces: one-minute partitions, so that a
// run of a minute crosses several, created a quarter of an hour ahead,
// which exceeds the records' retention.
const (
	partitionInterval    = time.Minute
	partitionAhead       = 15 * time.Minute
	partitionedRetention = 10 * time.Minute
	// seedPartitions expired partitions, of seedRecords records each, are
	// created before the phase for the janitor to drop under the faults.
	seedPartitions = 30
	seedRecords    = 3
)

// inboxStore is what the suite needs of an inbox table: the store of the
// transactional and two-phase inboxes, and its migration.
type inboxStore interface {
	repository.Driver[*sql.Tx]
	repository.TwoPhase
	Migrate(ctx context.Context) error
}

// inboxRepository is the inbox store of s: postgres.Repository, or
// postgres.PartitionedRepository when s.Partitioned, on s.Names.Inbox as
// spelled there.
func inboxRepository(db *sql.DB, s spec) (inboxStore, error) {
	if !s.Partitioned {
		return postgres.NewRepository(db, postgres.Config{Table: s.Names.Inbox})
	}
	return partitionedRepository(db, s.Names.Inbox)
}

func partitionedRepository(db *sql.DB, table string) (*postgres.PartitionedRepository, error) {
	return postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table, Interval: partitionInterval, Ahead: partitionAhead})
}

// JanitorTally is the partitioned inbox's cleanup under the faults:
// expired partitions seeded before the phase, dropped by DeleteExpired
// (the janitor's call) while the workers claim and the faults hit.
type JanitorTally struct {
	Partitions, Records int // expired partitions and records seeded
	Runs, Errors        int // DeleteExpired calls during the phase, failed ones
	Deleted             int // records the calls reported deleted
	// Left is the seeded records still in the table after the final
	// call, which must drop them all.
	Left int
}

// OK reports whether the janitor dropped every seeded record.
func (j JanitorTally) OK() bool { return j.Partitions > 0 && j.Left == 0 }

// sweeper drops the seeded partitions a few at a time during the phase:
// its cutoff walks from the oldest seeded expiry to the newest over
// spread, so detaches keep falling among the claims and the faults.
type sweeper struct {
	db       *sql.DB // application_name chaos-janitor: the faults hit it too
	repo     *postgres.PartitionedRepository
	table    string
	from, to time.Time // the seeded expiries
	spread   time.Duration
	tally    JanitorTally
}

// seedExpired claims records that expired long ago into seedPartitions
// partitions of n.Inbox and returns the janitor that will drop them.
func (e *env) seedExpired(ctx context.Context, n names, spread time.Duration) (*sweeper, error) {
	db, err := openDB(e.dsn("chaos-janitor"), 2)
	if err != nil {
		return nil, err
	}
	repo, err := partitionedRepository(db, n.Inbox)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	to := time.Now().UTC().Truncate(partitionInterval).Add(-15 * time.Minute)
	j := &sweeper{db: db, repo: repo, table: n.Inbox, from: to.Add(-seedPartitions * partitionInterval), to: to, spread: spread}
	for p := range seedPartitions {
		expires := j.from.Add(time.Duration(p)*partitionInterval + partitionInterval/2)
		tx, err := e.admin.BeginTx(ctx, nil)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		params := make([]repository.ClaimParams, 0, seedRecords)
		for r := range seedRecords {
			params = append(params, repository.ClaimParams{Consumer: "chaos-seed", Key: fmt.Sprintf("seed-%d-%d", p, r),
				PayloadHash: []byte{1}, Now: expires.Add(-time.Hour), ExpiresAt: expires})
		}
		_, err = repo.Claim(ctx, tx, params)
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			_ = db.Close()
			return nil, fmt.Errorf("chaos: seeding expired partitions: %w", err)
		}
	}
	j.tally.Partitions, j.tally.Records = seedPartitions, seedPartitions*seedRecords
	return j, nil
}

// cutoff is the janitor's DeleteExpired argument elapsed into the phase.
func (j *sweeper) cutoff(elapsed time.Duration) time.Time {
	if elapsed >= j.spread || j.spread <= 0 {
		return j.to
	}
	return j.from.Add(time.Duration(float64(j.to.Sub(j.from)) * float64(elapsed) / float64(j.spread)))
}

// run calls DeleteExpired every 300 ms until ctx ends; failures (a
// terminated connection, the server restarting) are counted and the
// next call tries again.
func (j *sweeper) run(ctx context.Context) {
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := j.repo.DeleteExpired(cctx, j.cutoff(time.Since(start)), 1000)
		cancel()
		j.tally.Runs++
		j.tally.Deleted += n
		if err != nil && ctx.Err() == nil {
			j.tally.Errors++
		}
	}
}

// finish makes the last call, with no more faults, retried until it
// succeeds, counts the seeded records left and closes the janitor.
func (j *sweeper) finish(ctx context.Context) (*JanitorTally, error) {
	defer j.db.Close()
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		n, err := j.repo.DeleteExpired(ctx, j.to, 1000)
		j.tally.Deleted += n
		if last = err; err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return &j.tally, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if last != nil {
		return &j.tally, fmt.Errorf("chaos: the janitor's last DeleteExpired: %w", last)
	}
	if err := j.db.QueryRowContext(ctx, `SELECT count(*) FROM `+j.table+` WHERE expires_at < $1`, j.to).Scan(&j.tally.Left); err != nil {
		return &j.tally, err
	}
	return &j.tally, nil
}
