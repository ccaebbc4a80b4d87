package chaos

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// Roles of RunSurfaces' children.
const (
	roleCaller = "caller" // calls once.Do for every key (surfaceSpec.API)
	roleServer = "server" // serves HTTP with httpidem in front of the effect
)

// APIs a keyed scenario drives.
const (
	apiOnceTx       = "once.Transactional"
	apiOnceTwoPhase = "once.TwoPhase"
	apiHTTP         = "httpidem"
)

// Outcomes of one call (a caller's answer for a key, after its retries).
const (
	outcomeOK           = "ok"           // fn ran in this call
	outcomeReplayed     = "replayed"     // an earlier call's output returned
	outcomeIntervention = "intervention" // ErrNeedsIntervention / 409 needs-intervention
	outcomeFailed       = "failed"       // another permanent answer (payload mismatch, 4xx)
	outcomeGaveUp       = "gave up"      // transient errors until the call's deadline
)

// callDeadline bounds one call's retries: longer than a restart of the
// server and a lease together take.
const callDeadline = 90 * time.Second

// surfaceSpec is a keyed scenario's part of a child's spec.
type surfaceSpec struct {
	API string
	// Finite: the child exits 0 once every call is answered, and the
	// supervisor then leaves its slot empty (callers; servers run until
	// stopped).
	Finite bool
	// Keys are called k-000000 to k-(Keys-1); key i falls due at Start +
	// Spread·i/Keys, in every caller at once, so callers race on it. A
	// fraction Late of the keys each caller calls again LateAfter later.
	Keys, Callers int
	Start         time.Time
	Spread        time.Duration
	Late          float64
	LateAfter     time.Duration
	Addr          string // server: where to listen
	Outcomes      string // the ledger (SQLite) table of the callers' answers
}

func keyName(i int) string { return fmt.Sprintf("k-%06d", i) }

// call is one call a caller makes: key's first (pass 0) or late (pass 1)
// call, due at Due.
type call struct {
	Key  string
	Pass int
	Due  time.Time
}

// plan is the calls caller makes, by due time. It is the same in every
// generation of the caller, so a restarted one skips what it answered.
func (s surfaceSpec) plan(caller string) []call {
	var calls []call
	for i := range s.Keys {
		key := keyName(i)
		due := s.Start.Add(time.Duration(int64(s.Spread) * int64(i) / int64(s.Keys)))
		calls = append(calls, call{Key: key, Due: due})
		h := fnv.New32a()
		_, _ = h.Write([]byte(caller + "/" + key))
		if float64(h.Sum32()%1000) < s.Late*1000 {
			calls = append(calls, call{Key: key, Pass: 1, Due: due.Add(s.LateAfter)})
		}
	}
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].Due.Before(calls[j].Due) })
	return calls
}

// answer is what a call ended with.
type answer struct {
	Key, Caller string
	Pass        int
	Outcome     string
	Value       string // ok, replayed: the output; otherwise the last error
	Attempts    int
}

// attemptFunc makes one attempt of a call: its outcome and value, or
// retry with the error as value.
type attemptFunc func(ctx context.Context, key string) (outcome, value string, retry bool)

// callUntilAnswered retries a call's attempts, with backoff, until one
// answers or callDeadline passes.
func callUntilAnswered(ctx context.Context, key string, attempt attemptFunc) answer {
	start := time.Now()
	backoff := 50 * time.Millisecond
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		outcome, value, retry := attempt(actx, key)
		cancel()
		if !retry {
			return answer{Key: key, Outcome: outcome, Value: value, Attempts: n}
		}
		if time.Since(start) > callDeadline || ctx.Err() != nil {
			return answer{Key: key, Outcome: outcomeGaveUp, Value: value, Attempts: n}
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// runCalls makes calls with callers goroutines, each call when it falls
// due, and records every answer. A call cut short by ctx is not
// recorded.
func runCalls(ctx context.Context, calls []call, callers int, attempt attemptFunc, record func(call, answer) error) error {
	work := make(chan call)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range callers {
		wg.Go(func() {
			for c := range work {
				select {
				case <-ctx.Done():
					continue
				case <-time.After(time.Until(c.Due)):
				}
				a := callUntilAnswered(ctx, c.Key, attempt)
				if ctx.Err() != nil {
					continue
				}
				if err := record(c, a); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, c := range calls {
		select {
		case work <- c:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// newToken identifies one run of an effect: the ledger row holds it and
// the caller's answer must return it.
func newToken(process string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return process + "/" + hex.EncodeToString(b[:])
}

// applyExternal is the effect of the two-phase surfaces: a row in a
// ledger in another database than the store (SQLite, never faulted),
// between two pauses so that kills land during the effect. The insert is
// not cancelled with the call: a half-sent insert would leave its outcome
// unknown.
func applyExternal(ctx context.Context, s spec, ledger *sql.DB, key string) (string, error) {
	pause(ctx, s.EffectDelay)
	token := newToken(s.Name)
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_, err := ledger.ExecContext(ictx, `INSERT INTO `+s.Names.Effects+` (order_id, token, process) VALUES (?, ?, ?)`, key, token, s.Name)
	cancel()
	if err != nil {
		return "", err
	}
	pause(ctx, s.EffectDelay)
	return token, nil
}

// onceOutcome classifies a once.Do result: the two permanent answers
// end the call, every other error is retried (busy keys, dropped
// connections, a lost lease).
func onceOutcome(res once.Result, err error) (outcome, value string, retry bool) {
	switch {
	case err == nil && res.Replayed:
		return outcomeReplayed, string(res.Value), false
	case err == nil:
		return outcomeOK, string(res.Value), false
	case errors.Is(err, idempotency.ErrNeedsIntervention):
		return outcomeIntervention, err.Error(), false
	case errors.Is(err, idempotency.ErrPayloadMismatch):
		return outcomeFailed, err.Error(), false
	default:
		return "", err.Error(), true
	}
}

// runCaller makes every call of its plan not answered by an earlier
// generation, through once.Transactional (the effect a row written in
// the call's transaction) or once.TwoPhase (the effect applyExternal),
// and records the answers in the ledger.
func runCaller(ctx context.Context, s spec, logger watermill.LoggerAdapter) error {
	sp := s.Surface
	_, ledger, repo, closeAll, err := openSurface(s, sp.Callers+2)
	if err != nil {
		return err
	}
	defer closeAll()
	var attempt attemptFunc
	switch sp.API {
	case apiOnceTx:
		o, err := once.NewTransactional(repo, once.Config{Scope: "chaos", Logger: logger})
		if err != nil {
			return err
		}
		insert := `INSERT INTO ` + s.Names.Effects + ` (order_id, token, process) VALUES ($1, $2, $3)`
		attempt = func(ctx context.Context, key string) (string, string, bool) {
			return onceOutcome(o.Do(ctx, key, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				token := newToken(s.Name)
				_, err := tx.ExecContext(ctx, insert, key, token, s.Name)
				return []byte(token), err
			}))
		}
	case apiOnceTwoPhase:
		o, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: repo, Scope: "chaos", Lease: s.Lease, OnExpiredLease: s.Policy, Logger: logger})
		if err != nil {
			return err
		}
		attempt = func(ctx context.Context, key string) (string, string, bool) {
			return onceOutcome(o.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
				token, err := applyExternal(ctx, s, ledger, key)
				return []byte(token), err
			}))
		}
	default:
		return fmt.Errorf("unknown API %q", sp.API)
	}
	answered := map[call]bool{}
	rows, err := ledger.QueryContext(ctx, `SELECT key, pass FROM `+sp.Outcomes+` WHERE caller = ?`, s.Name)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c call
		if err := rows.Scan(&c.Key, &c.Pass); err != nil {
			return err
		}
		answered[c] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var todo []call
	for _, c := range sp.plan(s.Name) {
		if !answered[call{Key: c.Key, Pass: c.Pass}] {
			todo = append(todo, c)
		}
	}
	return runCalls(ctx, todo, sp.Callers, attempt, func(c call, a answer) error {
		a.Caller, a.Pass = s.Name, c.Pass
		return recordAnswer(context.WithoutCancel(ctx), ledger, sp.Outcomes, a)
	})
}

// openSurface opens a keyed child's stores: the private cluster (at most
// maxConns connections), its inbox table there and the SQLite ledger.
func openSurface(s spec, maxConns int) (db, ledger *sql.DB, repo *postgres.Repository[*sql.Tx], closeAll func(), err error) {
	if db, err = openDB(s.DSN, maxConns); err != nil {
		return nil, nil, nil, nil, err
	}
	if ledger, err = sqlite.Open(s.LedgerPath); err != nil {
		_ = db.Close()
		return nil, nil, nil, nil, err
	}
	closeAll = func() { _ = ledger.Close(); _ = db.Close() }
	if repo, err = postgres.NewRepository(db, postgres.Config{Table: s.Names.Inbox}); err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	return db, ledger, repo, closeAll, nil
}

func recordAnswer(ctx context.Context, ledger *sql.DB, table string, a answer) error {
	_, err := ledger.ExecContext(ctx, `INSERT INTO `+table+` (key, caller, pass, outcome, value, attempts) VALUES (?, ?, ?, ?, ?, ?)`,
		a.Key, a.Caller, a.Pass, a.Outcome, a.Value, a.Attempts)
	return err
}

// charge is the HTTP scenario's request body.
type charge struct {
	Key string `json:"key"`
}

// runServer serves POST /charge with httpidem in front of a handler whose
// effect is applyExternal and whose response is 201 with the effect's
// token, until ctx ends.
func runServer(ctx context.Context, s spec, logger watermill.LoggerAdapter) error {
	db, ledger, repo, closeAll, err := openSurface(s, 16)
	if err != nil {
		return err
	}
	defer closeAll()
	probing := make(chan struct{})
	go func() { defer close(probing); pingEvery(ctx, db, probeEvery) }()
	defer func() { <-probing }()
	idem, err := httpidem.New(httpidem.Config{Repository: repo, Namespace: "chaos", Global: true, Lease: s.Lease, OnExpiredLease: s.Policy, Logger: logger})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /charge", idem.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c charge
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.Key == "" {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		token, err := applyExternal(r.Context(), s, ledger, c.Key)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, token)
	})))
	// The previous generation's port may take a moment to free.
	var ln net.Listener
	for deadline := time.Now().Add(10 * time.Second); ; {
		if ln, err = net.Listen("tcp", s.Surface.Addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// pingEvery pings db every interval until ctx ends, as a deployed server's
// readiness probe would. It keeps a connection of each server open once
// the callers are done, so that a pg_terminate_backend fault still dealt
// then finds one to hit: the keyed scenarios wait for every fault kind.
func pingEvery(ctx context.Context, db *sql.DB, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, interval)
		_ = db.PingContext(pctx)
		cancel()
	}
}

// probeEvery is how often a server pings its database.
const probeEvery = 250 * time.Millisecond

// httpAttempt sends one POST /charge for key to one of the servers, and
// classifies the answer as a client following the draft would: 201 and
// 200 answer (Idempotent-Replayed: true for a replay); 409
// needs-intervention ends the call; 409 in flight, 5xx and connection
// errors are retried; anything else is a failure.
func httpAttempt(client *http.Client, server func() string) attemptFunc {
	return func(ctx context.Context, key string) (string, string, bool) {
		body, _ := json.Marshal(charge{Key: key})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+server()+"/charge", strings.NewReader(string(body)))
		if err != nil {
			return outcomeFailed, err.Error(), false
		}
		req.Header.Set(httpidem.HeaderKey, `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return "", err.Error(), true
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err.Error(), true
		}
		switch {
		case resp.StatusCode == http.StatusCreated && resp.Header.Get(httpidem.HeaderReplayed) == "true":
			return outcomeReplayed, string(b), false
		case resp.StatusCode == http.StatusCreated:
			return outcomeOK, string(b), false
		case resp.StatusCode == http.StatusConflict && strings.Contains(string(b), httpidem.ProblemNeedsIntervention):
			return outcomeIntervention, string(b), false
		case resp.StatusCode == http.StatusConflict || resp.StatusCode >= 500:
			return "", fmt.Sprintf("%d %s", resp.StatusCode, b), true
		default:
			return outcomeFailed, fmt.Sprintf("%d %s", resp.StatusCode, b), false
		}
	}
}
