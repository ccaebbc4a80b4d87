//go:build unix

package middleware_test

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// BenchmarkOwnCost measures what the middleware itself costs a delivery,
// with a transaction that does nothing: no database, no network. It is
// the part of cpucost's Go column that this package can change, in the
// default mode and under group commit (16 deliveries in flight).
func BenchmarkOwnCost(b *testing.B) {
	handler := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	payload := []byte(`{"id":"o","amount":1}`)
	for _, mode := range []struct {
		name  string
		batch middleware.BatchConfig
		c     int
	}{{"default", middleware.BatchConfig{}, 1}, {"batch16", middleware.BatchConfig{MaxMessages: 16}, 16}} {
		b.Run(mode.name, func(b *testing.B) {
			inbox, err := middleware.NewInbox(nopDriver{}, middleware.Config{Consumer: "bench", Batch: mode.batch})
			if err != nil {
				b.Fatal(err)
			}
			mw := inbox.Middleware(handler)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			var wg sync.WaitGroup
			per := (b.N + mode.c - 1) / mode.c
			for g := range mode.c {
				wg.Go(func() {
					for i := range per {
						msg := message.NewMessage(strconv.Itoa(g)+"-"+strconv.Itoa(i), payload)
						if _, err := mw(msg); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			// Wall time per op flatters 16 goroutines on several cores:
			// CPU time is what a delivery costs the machine.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopDriver is a driver whose transactions claim every key and store
// nothing.
type nopDriver struct{}

type nopTx struct{}

func (nopDriver) Get(context.Context, string, string) (repository.Record, error) {
	return repository.Record{}, repository.ErrNotFound
}
func (nopDriver) Begin(context.Context) (nopTx, error) { return nopTx{}, nil }
func (d nopDriver) BeginClaim(ctx context.Context, params []repository.ClaimParams) (nopTx, []repository.Claim, error) {
	claims, err := d.Claim(ctx, nopTx{}, params)
	return nopTx{}, claims, err
}
func (nopDriver) Claim(_ context.Context, _ nopTx, params []repository.ClaimParams) ([]repository.Claim, error) {
	claims := make([]repository.Claim, len(params))
	for k := range claims {
		claims[k].Claimed = true
	}
	return claims, nil
}
func (nopDriver) SaveResult(context.Context, nopTx, repository.SaveResultParams) error { return nil }
func (nopDriver) Commit(context.Context, nopTx) error                                  { return nil }
func (nopDriver) Rollback(context.Context, nopTx) error                                { return nil }
func (nopDriver) Retryable(error) bool                                                 { return false }
func (d nopDriver) Reserve(context.Context) (repository.Driver[nopTx], func(), error) {
	return d, func() {}, nil
}
