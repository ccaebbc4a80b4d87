package main

import (
	"syscall"
	"time"
)

// sleepRTT sleeps d in the kernel (nanosleep), blocking the goroutine's
// thread. time.Sleep will not do for a round trip: when the process has
// nothing else to run, Go waits for timers in epoll_wait, whose timeout
// is in milliseconds, so a 300 µs sleep takes over 1 ms. nanosleep
// overshoots by tens of µs (more on a loaded machine); the harness
// reports the mean delay it actually got.
func sleepRTT(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
