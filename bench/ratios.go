package main

// scenario is one line of the table: a scenario on one backend, run at
// every concurrency of -c; P (connection-limited) runs at -pool-c alone.
type scenario struct {
	id, label, backend string
	run                func(c int) (result, error)
}

// ratio is one line of the ratio table: the throughput of num over den
// at each concurrency; rows missing on either side print "-", and a line
// with no cell at all is left out. boundNum over boundDen (pgbench rows,
// backend postgres) is the same ratio of the SQL alone, printed beside
// it: what the statements allow before any Go runs. Group commit's lines
// are batchRatios.
type ratio struct {
	name, target, num, numBackend, den, denBackend string
	boundNum, boundDen                             string
}

// pgbench rows: F itself and the SQL of A, B and G replayed.
const (
	fInsert    = "F pgbench INSERT"
	fBare      = "F pgbench A's SQL"
	fInbox     = "F pgbench B's SQL"
	fGroup     = "FG pgbench G's SQL"
	fGroupPipe = "FGP pgbench G's SQL, pipelined"
	// fGroupGo is not pgbench but Go (pgx) sending G's statements in
	// FG's shape (scenarioGoGroup), backend pgx.
	fGroupGo = "FGX Go (pgx) G's SQL"
	// fGroupRouter is FGX's transactions fed by the router and grouped
	// by a hand-written batcher (scenarioRouterGroup), backend pgx.
	fGroupRouter = "FGR Go (pgx) G's SQL, router-fed"
)

// baseRatios are the built-in ratio lines, in print order.
var baseRatios = []ratio{
	{"B/A  inbox vs bare (database/sql)", "≥ 0.9", "B inbox", "postgres", "A bare handler", "postgres", fInbox, fBare},
	{"B/A  inbox vs bare (pgx)", "≥ 0.9", "B inbox", "pgx", "A bare handler", "pgx", fInbox, fBare},
	{"C/B  duplicate vs first delivery (database/sql)", "≥ 3", "C duplicates (2nd pass)", "postgres", "B inbox", "postgres", "", ""},
	{"C/B  duplicate vs first delivery (pgx)", "≥ 3", "C duplicates (2nd pass)", "pgx", "B inbox", "pgx", "", ""},
	{"B/A  no adaptive read (database/sql)", "", "B inbox, no adaptive read", "postgres", "A bare handler", "postgres", fInbox, fBare},
	{"C/B  no adaptive read (database/sql)", "", "C duplicates, no adaptive read", "postgres", "B inbox, no adaptive read", "postgres", "", ""},
	{"B/A  no adaptive read (pgx)", "", "B inbox, no adaptive read", "pgx", "A bare handler", "pgx", fInbox, fBare},
	{"C/B  no adaptive read (pgx)", "", "C duplicates, no adaptive read", "pgx", "B inbox, no adaptive read", "pgx", "", ""},
	{"C/B  with ReadFirst (both)", "", "C duplicates, ReadFirst", "postgres", "B inbox, ReadFirst", "postgres", "", ""},
	{"B/A  with ReadFirst", "", "B inbox, ReadFirst", "postgres", "A bare handler", "postgres", fInbox, fBare},
	{"B/W  inbox vs watermill-sql (batch 100; W pre-published)", "", "B inbox", "postgres", "W watermill-sql (batch 100)", "postgres", "", ""},
	{"B/W  inbox vs watermill-sql (batch 100; W's publish timed)", "", "B inbox", "postgres", "W watermill-sql (batch 100) incl. publish", "postgres", "", ""},
	{"B/W1 inbox vs watermill-sql (batch 1; W pre-published)", "", "B inbox", "postgres", "W1 watermill-sql (batch 1)", "postgres", "", ""},
	{"B/F  inbox vs pgbench", "≥ 0.7", "B inbox", "postgres", fInsert, "postgres", fInbox, fInsert},
	{"A/F  bare vs pgbench", "", "A bare handler", "postgres", fInsert, "postgres", fBare, fInsert},
	{"A/FA bare vs pgbench running A's SQL", "", "A bare handler", "postgres", fBare, "postgres", "", ""},
	{"B/FB inbox vs pgbench running B's SQL", "", "B inbox", "postgres", fInbox, "postgres", "", ""},
	{"B/D  inbox vs Deduplicator", "", "B inbox", "postgres", "D Deduplicator (memory)", "postgres", "", ""},
	{"E/A  sqlite inbox vs sqlite bare", "", "E inbox", "sqlite", "E bare handler", "sqlite", "", ""},
	{"E/A  mariadb inbox vs mariadb bare", "", "E inbox", "mariadb", "E bare handler", "mariadb", "", ""},
	{"C/B  mariadb duplicate vs first delivery", "", "E duplicates (2nd pass)", "mariadb", "E inbox", "mariadb", "", ""},
	{"E/A  redis two-phase vs bare (pg)", "", "E two-phase inbox", "redis+pg", "A bare handler", "postgres", "", ""},
}
