//go:build race

package redis_test

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
