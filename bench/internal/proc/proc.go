// Package proc reads the Linux /proc figures the benchmark programs
// report beside their numbers.
package proc

import (
	"os"
	"strings"
)

// LoadAverage returns /proc/loadavg's first three fields, or "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
