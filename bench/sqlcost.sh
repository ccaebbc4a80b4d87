#!/usr/bin/env bash
# sqlcost.sh: is the inbox's SQL cheaper in another table shape?
#
# pgbench replays FA (BEGIN; business INSERT; COMMIT) and FB (BEGIN; claim
# INSERT … ON CONFLICT DO NOTHING; business INSERT; COMMIT), exactly as
# bench/pgbench.go does, with the inbox table in each variant below; the
# variants run interleaved (every round runs each variant once at each c,
# in an order reversed every other round), on fresh tables after a
# CHECKPOINT; one line a run: tps, WAL bytes (pg_stat_wal), full-page
# images and exited backends' CPU µs per transaction. SUMMARY=runs.tsv
# prints medians and the median of each round's variant ÷ A. Variants: A
# (FA), base (migrations 0001+0002), noexp / nolease / pkonly (without
# the expiry index / the lease index / both), brin (BRIN expiry index),
# collc (keys COLLATE "C"), reorder (fixed-width columns first), nocompl
# (completed_at NULL), plain (claim without ON CONFLICT), rt (SELECT 1 in
# the claim's place), nopk (no index, no ON CONFLICT). Only base, and any
# variant that stores the same and serves the same queries, are options;
# the rest are bounds. Meant for a private cluster:
#
#   pg_createcluster 15 sqlcost -p 5460 && pg_ctlcluster 15 sqlcost start
#   psql -h 127.0.0.1 -p 5460 -U postgres -c 'CREATE DATABASE test'
#   RUNS=5 TXNS=6000 bench/sqlcost.sh > runs.tsv
#   SUMMARY=runs.tsv bench/sqlcost.sh
#   pg_ctlcluster 15 sqlcost stop && pg_dropcluster 15 sqlcost
#
# SIZE=1 instead loads 1,000,000 claim rows into each variant and prints
# the table's and each index's size, and EXPLAIN ANALYZE of DeleteExpired
# (the janitor's statement, 1,000 rows) for the B-tree and BRIN variants.
# EXEC=1 runs ROWS (20,000) claims per variant in one PL/pgSQL loop and
# prints the backend's CPU (/proc/self/schedstat; superuser) and WAL bytes
# per claim: the claim's own cost, without round trip or commit.
set -euo pipefail

DSN=${DSN:-"host=127.0.0.1 port=5460 user=postgres dbname=test"}
RUNS=${RUNS:-5}
TXNS=${TXNS:-6000}
CS=${CS:-"1 4 16"}
VARIANTS=${VARIANTS:-"A base noexp nolease pkonly brin collc reorder nocompl plain rt nopk"}

psql_() { psql "$DSN" -X -q -v ON_ERROR_STOP=1 -At "$@"; }

# COLUMNS are the inbox's columns as migration 0001 creates them, one a
# line (the primary key left out), read from the migration itself.
MIGRATION=${MIGRATION:-"$(dirname "$0")/../repository/postgres/migrations/inbox/0001_create_inbox.up.sql"}
COLUMNS=$(sed -n '/^CREATE TABLE/,/^);/p' "$MIGRATION" | grep -E '^    [a-z_]+ ')
# REORDERED are the same with the fixed-width ones first: no alignment
# padding (variant reorder).
REORDERED=$(for c in created_at expires_at completed_at lease_until attempts consumer dedup_key state payload_hash result lease_owner; do
	grep -E "^    $c " <<<"$COLUMNS"
done)
[ "$(sort <<<"$REORDERED")" = "$(sort <<<"$COLUMNS")" ] || {
	echo "sqlcost.sh: the reorder variant's column list no longer matches $MIGRATION" >&2
	exit 1
}

# columns prints the inbox's columns (migration 0001) for a variant.
columns() {
	local lines=$COLUMNS pk="PRIMARY KEY (consumer, dedup_key)"
	case $1 in
	collc) lines=$(sed -E 's/^(    (consumer|dedup_key) +VARCHAR\(255\))/\1 COLLATE "C"/' <<<"$lines") ;;
	nopk) pk="CHECK (true)" ;;
	reorder) lines=$REORDERED ;;
	esac
	printf '%s\n    %s\n' "$lines" "$pk"
}

# ddl prints the inbox table $2 of variant $1 with its indexes.
ddl() {
	local v=$1 t=$2
	echo "CREATE TABLE $t ($(columns "$v"));"
	case $v in
	noexp | pkonly | nopk | brin) ;;
	*) echo "CREATE INDEX ${t}_exp ON $t (expires_at);" ;;
	esac
	[ "$v" = brin ] && echo "CREATE INDEX ${t}_exp ON $t USING brin (expires_at);"
	case $v in
	nolease | pkonly | nopk) ;;
	*) echo "CREATE INDEX ${t}_lease ON $t (lease_until) WHERE state = 'in_progress';" ;;
	esac
}

# claim prints the claim statement of variant $1 into table $2 (pgbench.go's claimRow).
claim() {
	local v=$1 t=$2 compl="now()" conflict=" ON CONFLICT (consumer, dedup_key) DO NOTHING"
	case $v in
	rt) echo "SELECT 1;" && return ;;
	nocompl) compl="NULL" ;;
	plain | nopk) conflict="" ;;
	esac
	echo "INSERT INTO $t (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at) VALUES ('bench', 'k' || :id, 'completed', sha256(('k' || :id)::bytea), 1, now(), $compl, now() + interval '7 days')$conflict;"
}

wal() { psql_ -c "SELECT wal_bytes, wal_fpi FROM pg_stat_wal" | tr '|' ' '; }

# cpu prints the CPU ticks (1/100 s) the cluster's exited backends used:
# the postmaster's children's times, once no client but this one is left.
PM=$(head -1 "$(psql_ -c 'SHOW data_directory')/postmaster.pid" 2>/dev/null || true)
cpu() {
	[ -r "/proc/$PM/stat" ] || { echo 0; return; }
	until [ "$(psql_ -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")" = 0 ]; do sleep 0.05; done
	awk '{print $16 + $17}' "/proc/$PM/stat"
}

run() { # variant c: one pgbench run on fresh tables; prints variant c tps walbytes/txn fpi/txn backend-CPU-µs/txn
	local v=$1 c=$2 dir script t=sc_inbox b=sc_orders
	dir=$(mktemp -d)
	script=$dir/tx.sql
	psql_ -c "DROP TABLE IF EXISTS $t, $b" -c "CREATE TABLE $b (id VARCHAR(64) NOT NULL PRIMARY KEY, amount BIGINT NOT NULL)"
	{
		echo '\set id random(1, 9000000000000000)'
		echo 'BEGIN;'
		[ "$v" != A ] && claim "$v" "$t"
		echo "INSERT INTO $b (id, amount) VALUES ('k' || :id, 1);"
		echo 'END;'
	} >"$script"
	[ "$v" != A ] && [ "$v" != rt ] && ddl "$v" "$t" | psql_
	psql_ -c CHECKPOINT
	local w0 f0 w1 f1 u0 u1 out tps txns=$((TXNS / c * c))
	read -r w0 f0 < <(wal)
	u0=$(cpu)
	out=$(pgbench -n -M prepared -c "$c" -j "$((c < 2 ? c : 2))" -t "$((TXNS / c))" -f "$script" "$DSN" 2>&1)
	read -r w1 f1 < <(wal)
	u1=$(cpu)
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
	[ -n "$tps" ] || { echo "$out" >&2; exit 1; }
	[ "$(psql_ -c "SELECT count(*) FROM $b")" = "$txns" ] || { echo "$v c=$c: rows missing" >&2; exit 1; }
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$v" "$c" "$tps" "$(((w1 - w0) / txns))" "$(awk "BEGIN{printf \"%.2f\", ($f1-$f0)/$txns}")" "$(((u1 - u0) * 10000 / txns))"
	rm -rf "$dir"
}

sizes() { # 1,000,000 claim rows per variant: sizes, and DeleteExpired's plan
	local t=sc_size
	for v in ${SIZE_VARIANTS:-base collc reorder nocompl brin}; do
		psql_ -c "DROP TABLE IF EXISTS $t"
		ddl "$v" "$t" | psql_
		# Keys in random order (as deliveries arrive), expires_at in
		# insertion order 10 ms apart, the first 300,000 rows already expired.
		psql_ -c "INSERT INTO $t (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
			SELECT 'bench', k, 'completed', sha256(k::bytea), 1, ts, $([ "$v" = nocompl ] && echo NULL || echo ts), ts + interval '7 days'
			FROM (SELECT 'k' || (random() * 9e15)::bigint AS k, now() - interval '7 days 50 minutes' + i * interval '10 ms' AS ts
			      FROM generate_series(1, 1000000) i) s ON CONFLICT DO NOTHING" -c "VACUUM ANALYZE $t"
		printf '%s\theap %s\t' "$v" "$(psql_ -c "SELECT pg_size_pretty(pg_relation_size('$t'))")"
		psql_ -c "SELECT string_agg(c.relname || ' ' || pg_size_pretty(pg_relation_size(c.oid)), ', ' ORDER BY c.relname)
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '$t'::regclass"
		if [ "$v" = base ] || [ "$v" = brin ]; then
			for i in 1 2 3; do # the janitor's statement (internal/sqlstore/postgres.go), 3 batches
				psql_ -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) DELETE FROM $t WHERE (consumer, dedup_key) IN (
					SELECT consumer, dedup_key FROM $t WHERE expires_at < now()
					ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED)" | sed "s/^/$v batch $i: /"
			done
		fi
	done
	psql_ -c "DROP TABLE IF EXISTS $t"
}

exec_cost() { # variant: the claim's executor cost, ROWS claims in one PL/pgSQL loop
	local v=$1 t=sc_exec stmt
	psql_ -c "DROP TABLE IF EXISTS $t"
	case $v in
	loop) stmt="PERFORM 'bench', k, sha256(k::bytea), now() + interval '7 days';" ;; # the loop alone
	*)
		ddl "$v" "$t" | psql_
		stmt=$(claim "$v" "$t" | sed "s/'k' || :id/k/g")
		;;
	esac
	# Backend CPU from /proc/self/schedstat (ns on CPU), WAL from the LSN:
	# the same backend, no round trip, no commit in the measured span.
	psql_ -c "DO \$\$ DECLARE k text; c0 bigint; c1 bigint; l0 pg_lsn; l1 pg_lsn; BEGIN
		PERFORM pg_current_wal_lsn();
		c0 := split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint; l0 := pg_current_wal_insert_lsn();
		FOR i IN 1..${ROWS:-20000} LOOP k := 'k' || (random() * 9e15)::bigint; $stmt END LOOP;
		c1 := split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint; l1 := pg_current_wal_insert_lsn();
		RAISE NOTICE '%', format(E'$v\t%s\t%s', round((c1 - c0) / 1000.0 / ${ROWS:-20000}, 2), round((l1 - l0) / ${ROWS:-20000}));
	END \$\$" 2>&1 | sed -n 's/^NOTICE:  //p'
	psql_ -c "DROP TABLE IF EXISTS $t"
}

if [ -n "${SUMMARY:-}" ]; then
	python3 - "$SUMMARY" <<'EOF'
import collections, statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip() and not l.startswith("variant")]
seen, data, vs, cs = collections.Counter(), {}, [], []
for v, c, tps, wal, fpi, cpu in rows:
    data[(v, c, seen[(v, c)])] = (float(tps), int(wal), int(cpu))
    seen[(v, c)] += 1
    vs += [v] if v not in vs else []
    cs += [c] if c not in cs else []
print("variant " + "".join("  tps c=%-3s ÷A  " % c for c in cs) + " WAL B/txn  CPU µs/txn")
for v in vs:
    line, wal, cpu = "%-8s" % v, [], []
    for c in cs:
        runs = range(seen[(v, c)])
        ratio = [data[(v, c, r)][0] / data[("A", c, r)][0] for r in runs if ("A", c, r) in data]
        line += "  %8.0f %5.2f " % (st.median(data[(v, c, r)][0] for r in runs), st.median(ratio or [0]))
        wal += [data[(v, c, r)][1] for r in runs]
        cpu.append("%.0f" % st.median(data[(v, c, r)][2] for r in runs))
    print(line + "  %8.0f  %s" % (st.median(wal), "/".join(cpu)))
EOF
	exit
fi
if [ "${EXEC:-}" = 1 ]; then # claim CPU µs and WAL bytes per row, interleaved rounds
	printf 'variant\tcpu_us_per_claim\twal_bytes_per_claim\n'
	for r in $(seq "$RUNS"); do
		for v in ${VARIANTS/A/loop}; do [ "$v" = rt ] || exec_cost "$v"; done
	done
	exit
fi
if [ "${SIZE:-}" = 1 ]; then
	sizes
	exit
fi
printf 'variant\tc\ttps\twal_bytes_per_txn\tfpi_per_txn\tbackend_cpu_us_per_txn\n'
vs=($VARIANTS)
for r in $(seq "$RUNS"); do
	for c in $CS; do
		order=("${vs[@]}")
		if ((r % 2 == 0)); then
			order=()
			for ((i = ${#vs[@]} - 1; i >= 0; i--)); do order+=("${vs[i]}"); done
		fi
		for v in "${order[@]}"; do run "$v" "$c"; done
	done
done
psql_ -c "DROP TABLE IF EXISTS sc_inbox, sc_orders"
