package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/bench/internal/stats"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// soakRetention is the inbox retention during the soak: short, so the
// soak's own records expire while it runs and the janitor keeps deleting
// them — the table, like the process, must stay flat.
const soakRetention = 2 * time.Minute

// Soak phases, for claim latencies.
const (
	phaseBaseline = iota // the expired backlog is in the table; no janitor yet
	phaseCleanup         // the janitor's first pass drains the backlog
	phaseAfter           // as long again, no janitor: a second baseline
	phaseSteady          // periodic janitor passes
)

var phaseNames = [...]string{"baseline", "cleanup", "after", "steady"}

// claimObserver collects the inbox's claim latencies: per report interval
// and per phase.
type claimObserver struct {
	phase    atomic.Int32
	mu       sync.Mutex
	interval []time.Duration
	phases   [phaseSteady][]time.Duration
	failed   atomic.Int64
}

func (o *claimObserver) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	if d.Outcome != idempotency.OutcomeProcessed {
		o.failed.Add(1)
	}
	p := o.phase.Load()
	o.mu.Lock()
	o.interval = append(o.interval, d.Claim)
	if p != phaseSteady {
		o.phases[p] = append(o.phases[p], d.Claim)
	}
	o.mu.Unlock()
}

func (o *claimObserver) takeInterval() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.interval
	o.interval = make([]time.Duration, 0, cap(d))
	return d
}

// runSoak sends o.soakN messages through B (the transactional inbox on
// PostgreSQL) at o.soakC handler goroutines. The inbox table starts with
// o.soakExpired expired records. The first tenth of the messages runs
// without a janitor (baseline claim latency); then a janitor pass drains
// the backlog while messages keep flowing (claim latency under cleanup);
// then, for as long as that pass took, no janitor again (a second
// baseline, after); then the janitor runs every 5 s, deleting the soak's own records as
// they expire (retention 2 minutes). Every interval it prints throughput,
// claim p99, Go heap, RSS and goroutines.
func runSoak(ctx context.Context, o options, w io.Writer) error {
	fmt.Fprintf(w, "soak: %d messages through B at concurrency %d, %d expired records for the janitor (batch %d, pause %s; 0 = default), GOMAXPROCS %d, load average %s\n",
		o.soakN, o.soakC, o.soakExpired, o.janitorBatch, o.janitorPause, runtime.GOMAXPROCS(0), proc.LoadAverage())
	db, err := openPostgres(testenv.PostgresDSN(), &roundTrips{})
	if err != nil {
		return fmt.Errorf("PostgreSQL (%s=%s) is required: %w", testenv.PostgresEnv, testenv.PostgresDSN(), err)
	}
	defer db.Close()
	configurePool(db, []int{o.soakC})
	pg := postgresDB(db, nil)
	t := &tables{d: pg}
	defer t.drop()

	b, err := newBusiness(ctx, pg, t, "bench_soak")
	if err != nil {
		return err
	}
	obs := &claimObserver{}
	inbox, repo, inboxTable, err := newInbox(ctx, pg, t, obs, soakRetention)
	if err != nil {
		return err
	}

	seedStart := time.Now()
	now := time.Now().UTC()
	if _, err := db.ExecContext(ctx, `INSERT INTO "`+inboxTable+`"
	(consumer, dedup_key, state, attempts, created_at, completed_at, expires_at)
SELECT 'expired', 'e' || n, 'completed', 1, $1, $1, $2 FROM generate_series(1, $3::int) AS s(n)`,
		now.Add(-8*24*time.Hour), now.Add(-time.Hour), o.soakExpired); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE "`+inboxTable+`"`); err != nil {
		return err
	}
	fmt.Fprintf(w, "seeded %d expired records in %s\n\n", o.soakExpired, time.Since(seedStart).Round(time.Millisecond))

	var deleted atomic.Int64
	j, err := janitor.NewJanitor(repo, janitor.Config{
		Interval:  5 * time.Second,
		BatchSize: o.janitorBatch,
		Pause:     o.janitorPause,
		Observer:  janitor.ObserverFunc(func(_ context.Context, b janitor.Batch) { deleted.Add(int64(b.Deleted)) }),
	})
	if err != nil {
		return err
	}
	defer j.Close()

	// The router and the feeders, as in deliver, but with messages made on
	// the fly (a million pre-built messages would be the memory we watch).
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer pubsub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		return err
	}
	var handled atomic.Int64
	var handlerErr atomic.Pointer[error]
	h := inbox.Middleware(b.inInbox)
	chain := func(msg *message.Message) error {
		if _, err := h(msg); err != nil {
			handlerErr.CompareAndSwap(nil, &err)
		}
		handled.Add(1)
		return nil
	}
	for g := range o.soakC {
		router.AddConsumerHandler(shard(g), shard(g), pubsub, chain)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(runCtx) }()
	<-router.Running()

	var (
		sent          atomic.Int64
		feeders       sync.WaitGroup
		janitorWG     sync.WaitGroup
		baselineDone  = make(chan struct{})
		baselineLimit = int64(o.soakN / 10)
		once          sync.Once
		cleanupTook   time.Duration
		cleanupErr    error
		cleanupDone   = make(chan struct{})
	)
	for g := range o.soakC {
		feeders.Go(func() {
			for runCtx.Err() == nil {
				i := sent.Add(1)
				if i > int64(o.soakN) {
					return
				}
				if i == baselineLimit {
					once.Do(func() { close(baselineDone) })
				}
				id := watermill.NewUUID()
				if err := pubsub.Publish(shard(g), message.NewMessage(id, fmt.Appendf(nil, `{"order":%q,"amount":%d}`, id, i))); err != nil {
					return
				}
			}
		})
	}
	// The janitor: first pass once the baseline is measured, then periodic.
	janitorWG.Go(func() {
		select {
		case <-baselineDone:
		case <-runCtx.Done():
			return
		}
		obs.phase.Store(phaseCleanup)
		start := time.Now()
		_, cleanupErr = j.RunOnce(runCtx)
		cleanupTook = time.Since(start)
		// A second baseline as long as the pass, brackets the pass in time:
		// background load on a shared machine changes within minutes.
		obs.phase.Store(phaseAfter)
		select {
		case <-time.After(cleanupTook):
		case <-runCtx.Done():
		}
		obs.phase.Store(phaseSteady)
		close(cleanupDone)
		_ = j.Run(runCtx)
	})

	start := time.Now()
	const lineFormat = "%6s %9s %7s %9s %9s %10s %10s %9s %10s %15s  %s\n"
	fmt.Fprintf(w, lineFormat, "t", "msgs", "msgs/s", "claim p50", "claim p99", "heap alloc", "heap inuse", "RSS", "goroutines", "janitor deleted", "phase")
	var (
		heapMin, heapMax, rssMin, rssMax int64
		rates                            []float64
		last                             int64
		lastAt                           = start
		feedersDone                      = make(chan struct{})
	)
	go func() { feeders.Wait(); close(feedersDone) }()
	report := func(final bool) {
		now := time.Now()
		n := handled.Load()
		rate := float64(n-last) / now.Sub(lastAt).Seconds()
		last, lastAt = n, now
		claims := obs.takeInterval()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		rss := currentRSS()
		phase := phaseNames[obs.phase.Load()]
		fmt.Fprintf(w, lineFormat,
			now.Sub(start).Round(time.Second), strconv.FormatInt(n, 10), fmt.Sprintf("%.0f", rate),
			fmtDur(stats.Percentile(claims, 50)), fmtDur(stats.Percentile(claims, 99)),
			fmt.Sprintf("%.1f MiB", mib(int64(ms.HeapAlloc))), fmt.Sprintf("%.1f MiB", mib(int64(ms.HeapInuse))),
			fmt.Sprintf("%.1f MiB", mib(rss)), strconv.Itoa(runtime.NumGoroutine()), strconv.FormatInt(deleted.Load(), 10), phase)
		// The first interval includes warm-up; the last may be partial.
		if n > 0 && !final && now.Sub(start) > o.soakInterval {
			heapMin, heapMax = minNonZero(heapMin, int64(ms.HeapInuse)), max(heapMax, int64(ms.HeapInuse))
			rssMin, rssMax = minNonZero(rssMin, rss), max(rssMax, rss)
			rates = append(rates, rate)
		}
	}
	ticker := time.NewTicker(o.soakInterval)
loop:
	for {
		select {
		case <-ticker.C:
			report(false)
		case <-feedersDone:
			break loop
		}
	}
	ticker.Stop()
	report(true)
	total := time.Since(start)

	// The backlog pass normally ends long before the messages do; if not,
	// wait for it so its numbers are complete.
	select {
	case <-cleanupDone:
	case <-ctx.Done():
	}
	cancel()
	janitorWG.Wait()
	closeErr := router.Close()
	runErr := <-routerErr
	var hErr error
	if p := handlerErr.Load(); p != nil {
		hErr = *p
	}
	if err := errors.Join(closeErr, runErr, hErr, cleanupErr); err != nil {
		return err
	}
	if got := handled.Load(); got != int64(o.soakN) {
		return fmt.Errorf("%d of %d messages handled", got, o.soakN)
	}
	if err := b.expect(ctx, o.soakN); err != nil {
		return err
	}

	base, during := obs.phases[phaseBaseline], obs.phases[phaseCleanup]
	fmt.Fprintf(w, "\nsoak: %d messages in %s (%.0f msgs/s overall)\n", o.soakN, total.Round(time.Second), float64(o.soakN)/total.Seconds())
	if len(rates) > 0 {
		fmt.Fprintf(w, "throughput per %s interval (after the first): min %.0f, max %.0f msgs/s\n", o.soakInterval, slicesMin(rates), slicesMax(rates))
	}
	fmt.Fprintf(w, "heap in use: %.1f–%.1f MiB; RSS: %.1f–%.1f MiB (after the first interval)\n", mib(heapMin), mib(heapMax), mib(rssMin), mib(rssMax))
	fmt.Fprintf(w, "janitor: first pass deleted the backlog in %s; %d records deleted in all\n", cleanupTook.Round(time.Millisecond), deleted.Load())
	for p, name := range []string{"without cleanup, before", "during cleanup", "without cleanup, after"} {
		d := obs.phases[p]
		fmt.Fprintf(w, "claim latency %-24s p50 %s p99 %s (%d claims)\n", name+":", fmtDur(stats.Percentile(d, 50)), fmtDur(stats.Percentile(d, 99)), len(d))
	}
	if bp99, dp99, ap99 := stats.Percentile(base, 99), stats.Percentile(during, 99), stats.Percentile(obs.phases[phaseAfter], 99); bp99 > 0 && ap99 > 0 {
		fmt.Fprintf(w, "cleanup raises claim p99 by %.2f× against before, %.2f× against after (target < 2×)\n",
			float64(dp99)/float64(bp99), float64(dp99)/float64(ap99))
	}
	fmt.Fprintf(w, "peak RSS (getrusage maxrss): %.1f MiB; load average at the end %s\n", mib(peakRSS()), proc.LoadAverage())
	return nil
}

func minNonZero(a, b int64) int64 {
	if a == 0 || b < a {
		return b
	}
	return a
}

func slicesMin(s []float64) float64 {
	m := s[0]
	for _, v := range s {
		m = min(m, v)
	}
	return m
}

func slicesMax(s []float64) float64 {
	m := s[0]
	for _, v := range s {
		m = max(m, v)
	}
	return m
}
