// Package httpidem is net/http middleware implementing the server side of
// the Idempotency-Key HTTP header
// (draft-ietf-httpapi-idempotency-key-header) on the stores of the
// two-phase inbox: a client that retries a POST after a timeout gets the
// first response again instead of a second payment.
//
//	repo, _ := redis.NewRepository(client, redis.Config{})
//	idem, err := httpidem.New(httpidem.Config{
//		Repository: repo,
//		Namespace:  "orders-api", // this service: keys are stored per Namespace
//		Principal: func(r *http.Request) (string, error) {
//			return auth.UserID(r.Context()) // set by the authentication middleware
//		},
//	})
//	if err != nil { … }
//	mux.Handle("POST /payments", idem.Middleware(http.HandlerFunc(pay)))
//
// Keys are stored per authenticated client and route, so one client's key
// can never replay another's response. The lease is the two-phase inbox's:
// storing the response is retried while the lease is held
// (Config.FinishRetry), so one dropped connection after the handler ran
// neither runs it twice nor leaves the key stuck in 409; every store call
// is bounded by Config.StoreTimeout. See docs/http.md for the behaviour
// table: missing key 400, in flight 409 with Retry-After, reused key with
// another request 422, repeat replayed with Idempotent-Replayed: true.
package httpidem
