//go:build !race

package chaos

// raceDetector is true when the tests run with -race (see race_test.go).
const raceDetector = false
