// Package janitor enforces retention: it deletes expired inbox records in
// bounded batches through a backend's [repository.Cleaner], so the inbox
// table stays the size of the redelivery window instead of growing forever.
//
// Start it with the router that consumes the messages:
//
//	j, err := janitor.NewJanitor(repo, janitor.Config{Logger: logger})
//	if err != nil { … }
//	defer j.Close()
//	router.AddPlugin(j.RouterPlugin()) // runs while the router runs
//
// or run it yourself (j.Run(ctx) in a goroutine), or drain once from a
// cron job (j.RunOnce(ctx)).
//
// Each batch is one short statement that deletes at most BatchSize records
// by primary key (on PostgreSQL skipping rows that claims hold locked), and
// the janitor pauses between batches, so claims interleave with cleanup
// instead of waiting behind it. Backends that expire records by themselves
// (Redis TTL) need no janitor.
//
// Config.Observer receives every batch; when it also implements
// [SampleObserver], every pass ends by counting the live records per
// consumer and state through [repository.Stats] — the source of the
// in-progress and stale record gauges. metrics.Metrics implements both:
//
//	j, err := janitor.NewJanitor(repo, janitor.Config{
//		Observer: m, // m: *metrics.Metrics
//		Logger:   logger,
//	})
//
// It lives in its own package rather than in repository so that the
// storage contracts stay free of Watermill, goroutines and timers.
package janitor
