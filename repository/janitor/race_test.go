//go:build race

package janitor_test

// raceDetector is true when the tests run with -race. The race detector
// instruments modernc.org/sqlite's translated C too, which makes SQLite
// about ten times slower; PostgreSQL and MariaDB run outside the process
// and are unaffected.
const raceDetector = true
