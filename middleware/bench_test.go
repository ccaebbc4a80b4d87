package middleware_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// BenchmarkInbox measures one delivery through the middleware with a
// one-INSERT handler: a first delivery (claim + write + commit) and a
// duplicate (claim conflict + read + rollback).
func BenchmarkInbox(b *testing.B) {
	for name, newStore := range map[string]func(testing.TB) *store{"postgres": newPostgresStore, "sqlite": newSQLiteStore, "mysql": newMySQLStore} {
		b.Run(name, func(b *testing.B) {
			s := newStore(b)
			h := &chargeHandler{s: s}
			mw := s.newInbox(b, "bench").Middleware(h.Handle)
			payload := orderMessage("", order{ID: "o", Amount: 1}).Payload

			b.Run("first", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, err := mw(message.NewMessage(fmt.Sprintf("first-%d", i), payload)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
			b.Run("duplicate", func(b *testing.B) {
				if _, err := mw(message.NewMessage("dup", payload)); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := mw(message.NewMessage("dup", payload)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		})
	}
}
