//go:build race

package chaos

// raceDetector is true when the tests run with -race. The storm test's 72
// callers with a 100 ms StoreTimeout time out for the race detector's
// sake, not the store's, so it runs without it (make chaos-ci).
const raceDetector = true
