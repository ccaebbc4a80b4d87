package dupetest_test

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/dupetest"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// The injector wrapped around a handler shows at once whether it is
// idempotent: a counter that adds on every delivery is not; the same
// counter behind a two-phase inbox is.
func Example() {
	deliver := func(h message.HandlerFunc) {
		dupes := dupetest.New(dupetest.Config{Seed: 1, Fraction: 0.5})
		wrapped := dupes.Middleware(h)
		for i := range 10 {
			if _, err := wrapped(message.NewMessage("payment-"+strconv.Itoa(i), []byte("1"))); err != nil {
				panic(err)
			}
		}
		dupes.Wait()
		s := dupes.Stats()
		fmt.Printf("10 messages, %d copies: ", s.Immediate+s.Late)
	}

	var balance atomic.Int32 // late copies arrive from other goroutines
	credit := func(msg *message.Message) ([]*message.Message, error) {
		balance.Add(1) // not idempotent: every copy adds again
		return nil, nil
	}
	deliver(credit)
	fmt.Println("balance without the inbox:", balance.Load())

	balance.Store(0)
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "payments"})
	if err != nil {
		panic(err)
	}
	deliver(inbox.Middleware(credit))
	fmt.Println("balance with the inbox:", balance.Load())
	// Output:
	// 10 messages, 3 copies: balance without the inbox: 13
	// 10 messages, 3 copies: balance with the inbox: 10
}
