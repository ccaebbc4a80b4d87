package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// peakRSS returns the peak resident set size of this process in bytes
// (getrusage maxrss). Children (pgbench) are not reported: Go starts them
// with vfork semantics, and the kernel charges a child the parent's peak
// RSS when it execs, so RUSAGE_CHILDREN would only echo ours.
func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss * 1024 // kilobytes on Linux
}

// currentRSS returns the resident set size now (/proc/self/statm), or 0
// where that file does not exist.
func currentRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
