// Package robustness checks that the stores keep their contract under
// faults, the way etcd's robustness tests do: concurrent clients drive
// the two-phase contract (acquire, reclaim, extend, complete, release,
// get) against a backend while a fault is injected — connections
// terminated, servers restarted or killed with SIGKILL — every call is
// recorded with its call and return times, and porcupine checks the
// history against Model, a sequential specification of one key's
// record, partitioned by key. A history that fails is written as
// porcupine's HTML visualization.
//
// A call that failed with an error outside the contract (a timeout, a
// lost connection) may or may not have taken effect; it is recorded with
// an infinite return time, so the checker may place it anywhere after its
// call, or at the end, where it changes nothing.
//
//	results := robustness.Run(ctx, robustness.Short(), os.Stderr)
//	robustness.PrintTable(os.Stdout, results) // backend × fault → ops, linearizable, anomalies
//
// The servers are private (PostgreSQL cluster 15/robust on port 5460,
// redis-server on 6390, 6391 and 6400), created for the run and removed after
// it; on the shared MariaDB the suite uses a database of its own and
// kills only its own connections. go run ./chaos/cmd/chaos -config
// robust runs the short profile (make chaos-ci), -config robust-full the
// long one.
package robustness
