//go:build !linux

package main

import "time"

// sleepRTT sleeps d. Outside Linux it is time.Sleep, whose precision
// below a millisecond depends on the platform; the harness reports the
// mean delay it actually got.
func sleepRTT(d time.Duration) { time.Sleep(d) }
