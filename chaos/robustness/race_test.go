//go:build race

package robustness

// raceDetector is true when the tests run with -race: make test, where
// every package runs at once, skips the private servers' cells, which
// make chaos-ci runs (go run ./chaos/cmd/chaos -config robust).
const raceDetector = true
