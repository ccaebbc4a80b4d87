// Package chaos is the project's fault suite: it proves with processes,
// a real broker and a real database server that the inbox keeps its
// promises when things break. Run it with
//
//	make chaos      # go run ./chaos/cmd/chaos -config full
//	make chaos-ci   # the small configuration .ci/run uses, then -config surfaces
//
// # What runs
//
// One binary plays every part (the re-exec pattern): started plainly it is
// the orchestrator; started by the orchestrator with a spec in its
// environment (IsChild, RunChild) it is a worker or the outbox relay.
// Separate processes are the point: a SIGKILL or an os.Exit takes the
// process's connections, unacknowledged deliveries and open transactions
// with it, as it does in production, which goroutines in one test
// process cannot show.
//
// A run has two phases, each with its own tables, exchanges and queues
// (named after a random run id, so runs never collide and a dirty
// database does not matter):
//
//   - transactional: Config.Workers worker processes compete on one
//     RabbitMQ queue (watermill-amqp, prefetch 1). Each is a Watermill
//     router whose billing handler runs under middleware.Inbox on
//     PostgreSQL, appends the order's effect to a ledger table in the inbox
//     transaction and returns a payment, written to the outbox in the same
//     transaction (Config.Outputs = outbox.Outputs). A relay process
//     forwards the outbox to a payments queue, and a receipts handler in
//     the same workers, under its own inbox, appends a receipt per payment.
//   - two-phase: the workers run middleware.NewTwoPhaseInbox with
//     Intervene; the effect is an insert into a ledger in another database
//     (a SQLite file in the run's log directory, never faulted), with a
//     pause before and after it so that kills land during the effect.
//
// The producer (in the orchestrator) spreads the orders over a duration,
// so faults fall mid-stream, and publishes a fraction of them twice with
// the same UUID, half at once and half later.
//
// # Faults
//
// A deck of fault kinds is shuffled and dealt one at a time, so every
// kind is injected before any is repeated, until every order took effect:
// a worker SIGKILLed (the supervisor restarts it), the relay SIGKILLed,
// the children's connections terminated (pg_terminate_backend), the
// relay's LISTEN connection terminated, the private cluster restarted in
// fast mode and in immediate mode (crash recovery). Besides, every worker
// exits by itself right after the inbox committed a fresh delivery and
// before the ack, with probability Config.ExitAfterCommit: a middleware
// outside the inbox calls os.Exit.
//
// The database faults hit a private PostgreSQL cluster created with
// Debian's postgresql-common (pg_createcluster VERSION chaos -p 5437,
// trust on 127.0.0.1; creating it needs root or the postgres user once),
// started at the beginning and stopped at the end. The shared cluster on
// port 5432 is never stopped, restarted or cut off: the code refuses to
// manage a cluster named main or on that port. Runs on one cluster are
// serialised by a lock file.
//
// # The ledger
//
// The ledger tables are append-only with no unique constraint, so a
// doubled effect is a second row to count rather than an error that
// would hide it. After the last order took effect the faults stop, the
// queues and the outbox are drained (the workers are stopped gracefully
// and started again until nothing is left), and then, per order:
//
//   - transactional: effects and receipts each exactly once — 0 doubled,
//     0 lost — nothing poisoned and no outbox row dead-lettered;
//   - two-phase with Intervene: 0 doubled; an order without effect must
//     have its key left in progress (routed to an operator), reported as
//     needing intervention together with how many of those had their
//     effect applied;
//   - two-phase with Reclaim (Config.TwoPhasePolicy, a control): 0 lost;
//     the doubles it shows are that policy's documented price, and prove
//     the ledger sees them.
//
// The command prints the fault table (faults injected by kind) and the
// ledger table (messages, doubled, lost) and exits 1 if a promise was
// broken. A missing prerequisite (RabbitMQ, postgresql-common) wraps
// ErrPrerequisite: the command skips naming it, or
// fails under CI=true.
//
// # Surfaces
//
// RunSurfaces (-config surfaces, or surfaces-full) puts the surfaces
// beside the router inbox under the same faults, on a private cluster of
// its own (surfaces, port 5450), so it can run beside Run. Four keyed
// scenarios run at once under one fault deck (a caller or server
// SIGKILLed, connections terminated, the cluster restarted fast and
// immediate): once.Transactional, whose effect is a row written in its
// transaction; once.TwoPhase under Reclaim and under Intervene, and
// httpidem (HTTP servers as child processes, clients in the
// orchestrator retrying on 5xx, 409 in flight and connection errors),
// whose effect is a row in the SQLite ledger. Every one of Workers
// callers calls every key at the same moment, so each key is raced, and
// calls a fraction of the keys again later; each call is retried until it
// is answered, and every answer is recorded with the token of the effect
// it reports. The tally counts per key: effects doubled; answers that
// are no applied effect's (Phase.Wrong); keys lost (no success, or no
// effect; under Intervene, no success and no record left in progress for
// an operator); and the intervention records. Then Run's transactional
// phase runs on postgres.PartitionedRepository, its table spelled t by
// half the workers and public.t by the others, while a janitor drops
// expired partitions seeded before the phase (JanitorTally). Every pool
// on the cluster is opened as a user opens one (sql.Open with pgx's
// driver, SetMaxOpenConns): that the callers' 0.67 s StoreTimeout does
// not let their reconnects after a fault fill the server's accept queue
// and lock every new connection out is the library's doing (sqlexec.Std),
// and what this configuration tests.
//
// # Storm
//
// RunStorm (-config storm) measures that directly, on a private cluster
// of its own (storm, port 5455, PostgreSQL's default max_connections of
// 100): for each driver (database/sql, pgxpool) and StoreTimeout (100 ms,
// 1 s, 5 s, with a Lease three times as long), 6 pools of 12 workers call
// once.TwoPhase from cold pools; after a warm-up and a baseline window
// every client backend is terminated, and the table gives the calls per
// second before the fault, the time until a 500 ms window is back at half
// of them (or never, within 30 s) and the largest accept queue of the
// cluster's listening socket meanwhile.
//
// # Failover
//
// RunFailover (-config failover) runs the transactional phase on a
// primary and a streaming replica (clusters ha-a and ha-b on ports 5440
// and 5441, the replica made with pg_basebackup -R) through a multi-host
// DSN with target_session_attrs=read-write, once per replication mode
// (asynchronous, synchronous_commit on, remote_apply). Mid-stream it
// stops the replication for a while (the commit stall), then stops it
// again, SIGKILLs the primary's processes and promotes the replica; the
// ledger counts the orders acknowledged to the broker whose effects are
// gone, and the old primary, started alone afterwards, shows they were
// committed there. A service measurement then times how long an
// in-process inbox, relay (with and without a Notifier) and janitor take
// to resume on the new primary on database/sql and on pgxpool, and
// checks that readiness reports the outage and the recovery.
package chaos
