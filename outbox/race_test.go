//go:build race

package outbox_test

// raceDetector is true when the tests run with -race. The race detector
// instruments modernc.org/sqlite's translated C too, which makes SQLite
// many times slower; PostgreSQL and MariaDB run outside the process.
const raceDetector = true
