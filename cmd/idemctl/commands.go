package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/mattn/go-isatty"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
)

// withStore opens the store, runs fn and closes it.
func withStore(ctx context.Context, g *Globals, fn func(*store) error) error {
	s, err := open(ctx, g)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func ago(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// confirm shows what a destructive command will change and asks. With
// --yes it proceeds; without a terminal on stdin it refuses.
func confirm(g *Globals, what string) error {
	if g.Yes {
		return nil
	}
	if fd := g.stdin.Fd(); !isatty.IsTerminal(fd) && !isatty.IsCygwinTerminal(fd) {
		return usagef("refusing to %s without confirmation: stdin is not a terminal; pass --yes", what)
	}
	fmt.Fprintf(g.stderr, "%s? [y/N] ", capitalize(what))
	answer, _ := bufio.NewReader(g.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errors.New("aborted: nothing changed")
}

// count is n and noun, plural unless n is 1: "1 record", "2 records".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// ---- stats ----

// StatsCmd prints record counts and the outbox backlog.
type StatsCmd struct {
	Consumer string `help:"Only this consumer."`
}

type statsOutput struct {
	Consumers []consumerStats `json:"consumers"`
	Outbox    *outboxStats    `json:"outbox,omitempty"`
}

// consumerStats is one consumer's line of stats: its live records by
// state (repository.RecordCount) and its expired records, which wait for
// purge (none on Redis, whose keys expire).
type consumerStats struct {
	Consumer   string `json:"consumer"`
	InProgress int    `json:"in_progress"`
	Stale      int    `json:"stale"`
	Completed  int    `json:"completed"`
	Expired    int    `json:"expired"`
}

type outboxStats struct {
	Table            string  `json:"table"`
	Messages         int     `json:"messages"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	DeadLetters      int     `json:"dead_letters"`
	Missing          bool    `json:"missing,omitempty"`
}

// Run implements the command.
func (c *StatsCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		st, err := s.stats()
		if err != nil {
			return err
		}
		now := time.Now()
		counts, err := st.CountRecords(ctx, now)
		if err != nil {
			return err
		}
		expired := map[string]int{}
		if s.db != nil {
			if expired, err = s.expiredByConsumer(ctx, now); err != nil {
				return err
			}
		}
		all := mergeCounts(counts, expired)
		if c.Consumer != "" {
			var names []string
			for _, cs := range all {
				names = append(names, cs.Consumer)
			}
			if err := knownConsumer(c.Consumer, names, "records"); err != nil {
				return err
			}
		}
		out := statsOutput{Consumers: []consumerStats{}}
		for _, cs := range all {
			if c.Consumer == "" || cs.Consumer == c.Consumer {
				out.Consumers = append(out.Consumers, cs)
			}
		}
		if s.outbox.Dialect != "" {
			b, err := s.backlog(ctx)
			switch {
			case err != nil && isMissingTable(err):
				out.Outbox = &outboxStats{Table: s.outbox.Table, Missing: true}
			case err != nil:
				return err
			default:
				out.Outbox = &outboxStats{Table: s.outbox.Table, Messages: b.Messages, OldestAgeSeconds: b.OldestAge.Seconds(), DeadLetters: b.DeadLetters}
			}
		}
		if g.JSON {
			return printJSON(g.stdout, out)
		}
		rows := [][]string{}
		for _, rc := range out.Consumers {
			rows = append(rows, []string{rc.Consumer, fmt.Sprint(rc.InProgress), fmt.Sprint(rc.Stale), fmt.Sprint(rc.Completed), fmt.Sprint(rc.Expired)})
		}
		if len(rows) == 0 {
			fmt.Fprintln(g.stdout, "no records")
		} else if err := table(g.stdout, "CONSUMER\tIN_PROGRESS\tSTALE\tCOMPLETED\tEXPIRED", rows); err != nil {
			return err
		}
		switch {
		case out.Outbox == nil:
		case out.Outbox.Missing:
			fmt.Fprintf(g.stdout, "\noutbox %s: no such table\n", out.Outbox.Table)
		default:
			o := out.Outbox
			fmt.Fprintf(g.stdout, "\noutbox %s: %s waiting, oldest %s old, %s\n",
				o.Table, count(o.Messages, "message"), time.Duration(o.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond), count(o.DeadLetters, "dead letter"))
		}
		return nil
	})
}

// mergeCounts joins the live counts and the expired ones by consumer, in
// consumer order; a consumer with only expired records has a line too.
func mergeCounts(live []repository.RecordCount, expired map[string]int) []consumerStats {
	by := map[string]*consumerStats{}
	for _, rc := range live {
		by[rc.Consumer] = &consumerStats{Consumer: rc.Consumer, InProgress: rc.InProgress, Stale: rc.Stale, Completed: rc.Completed}
	}
	for consumer, n := range expired {
		if by[consumer] == nil {
			by[consumer] = &consumerStats{Consumer: consumer}
		}
		by[consumer].Expired = n
	}
	out := make([]consumerStats, 0, len(by))
	for _, cs := range by {
		out = append(out, *cs)
	}
	slices.SortFunc(out, func(a, b consumerStats) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out
}

// ---- stuck ----

// StuckCmd groups the commands on stuck two-phase records.
type StuckCmd struct {
	List    StuckListCmd    `cmd:"" help:"List in-progress records whose lease expired (oldest lease first)."`
	Resolve StuckResolveCmd `cmd:"" help:"Mark a stuck record completed (the effect happened) or release it (it did not), fenced by its lease owner."`
}

// StuckListCmd lists stuck records.
type StuckListCmd struct {
	Consumer string `help:"Only this consumer."`
	Limit    int    `help:"Most records listed." default:"100"`
}

type stuckRecord struct {
	Consumer   string    `json:"consumer"`
	Key        string    `json:"key"`
	LeaseOwner string    `json:"lease_owner"`
	LeaseUntil time.Time `json:"lease_until"`
	Attempts   int       `json:"attempts"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiresAt  time.Time `json:"expires_at"`
}

func toStuck(r repository.Record) stuckRecord {
	return stuckRecord{Consumer: r.Consumer, Key: r.Key, LeaseOwner: r.LeaseOwner, LeaseUntil: r.LeaseUntil.UTC(),
		Attempts: r.Attempts, CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC()}
}

// Run implements the command.
func (c *StuckListCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		op, err := s.operator()
		if err != nil {
			return err
		}
		if err := s.checkConsumer(ctx, c.Consumer); err != nil {
			return err
		}
		now := time.Now()
		recs, err := op.ListStuck(ctx, repository.ListStuckParams{Consumer: c.Consumer, Now: now, Limit: c.Limit})
		if err != nil {
			return err
		}
		out := make([]stuckRecord, len(recs))
		for i, r := range recs {
			out[i] = toStuck(r)
		}
		if g.JSON {
			return printJSON(g.stdout, out)
		}
		if len(out) == 0 {
			fmt.Fprintln(g.stdout, "no stuck records")
			return nil
		}
		rows := make([][]string, len(out))
		for i, r := range out {
			rows[i] = []string{r.Consumer, r.Key, r.LeaseOwner, "expired " + ago(r.LeaseUntil, now), fmt.Sprint(r.Attempts), stamp(r.CreatedAt)}
		}
		return table(g.stdout, "CONSUMER\tKEY\tLEASE_OWNER\tLEASE\tATTEMPTS\tCREATED", rows)
	})
}

// StuckResolveCmd resolves one stuck record.
type StuckResolveCmd struct {
	Consumer string `required:"" help:"Consumer of the record."`
	Key      string `required:"" help:"Stored key, as stuck list prints it."`
	Owner    string `help:"Lease owner you expect (as stuck list prints it); the record changes only while it still holds it. Default: the owner read now."`
	Complete bool   `xor:"action" required:"" help:"The effect happened: mark the record completed; duplicates are acknowledged without running the handler and replay the --result messages (none by default)."`
	Result   string `help:"With --complete: a JSON file holding the handler's output messages, [{\"uuid\":…,\"metadata\":{…},\"payload\":\"…\"}] (a binary payload base64-encoded as \"payload_base64\"), stored with middleware.EncodeResult so duplicates replay them." type:"existingfile" placeholder:"FILE"`
	Release  bool   `xor:"action" required:"" help:"The effect did not happen: delete the record; the next delivery runs the handler."`
}

// Run implements the command.
func (c *StuckResolveCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		op, err := s.operator()
		if err != nil {
			return err
		}
		reader, ok := s.repo.(repository.Reader)
		if !ok {
			return fmt.Errorf("%s cannot read records", s.kind)
		}
		if err := s.checkConsumer(ctx, c.Consumer); err != nil {
			return err
		}
		// --key is the stored key stuck list prints or the original key;
		// Get hashes a long original key, Resolve takes the stored one.
		stored := repository.StorageKey(c.Key)
		rec, err := reader.Get(ctx, c.Consumer, c.Key)
		if errors.Is(err, repository.ErrNotFound) && stored != c.Key {
			// A hashed stored key ("sha256:…"): Get would hash it again.
			stored = c.Key
			rec, err = findStuck(ctx, op, c.Consumer, c.Key)
		}
		if errors.Is(err, repository.ErrNotFound) {
			return usagef("consumer %q has no record with key %q (pass the key as stuck list prints it)", c.Consumer, c.Key)
		}
		if err != nil {
			return err
		}
		now := time.Now()
		owner := c.Owner
		if owner == "" {
			owner = rec.LeaseOwner
		}
		switch {
		case rec.State != repository.StateInProgress:
			return fmt.Errorf("record %s/%s is %s, not stuck: nothing to resolve", c.Consumer, c.Key, rec.State)
		case rec.LeaseOwner != owner:
			return usagef("no in-progress record %s/%s is owned by %q: its lease owner is %q (check --owner against stuck list; if stuck list showed %q, another attempt has taken the record over since)",
				c.Consumer, c.Key, owner, rec.LeaseOwner, owner)
		case rec.LeaseUntil.After(now):
			return fmt.Errorf("record %s/%s is leased by %q for %s more: an attempt is running; wait for it", c.Consumer, c.Key, owner, rec.LeaseUntil.Sub(now).Round(time.Second))
		}
		action, verb := repository.ResolveRelease, "release (delete) it: the next delivery runs the handler again"
		var result []byte
		if c.Complete {
			msgs, err := readResult(c.Result)
			if err != nil {
				return err
			}
			if result, err = middleware.EncodeResult(msgs); err != nil {
				return err
			}
			action, verb = repository.ResolveComplete, fmt.Sprintf("mark it completed: later deliveries are acknowledged as duplicates, replaying %s", count(len(msgs), "output message"))
		} else if c.Result != "" {
			return usagef("--result goes with --complete")
		}
		fmt.Fprintf(g.stderr, "record %s/%s: in progress, lease owner %s, lease expired %s, %s, created %s\n",
			c.Consumer, c.Key, owner, ago(rec.LeaseUntil, now), count(rec.Attempts, "attempt"), stamp(rec.CreatedAt))
		fmt.Fprintf(g.stderr, "will %s\n", verb)
		if err := confirm(g, action.String()+" record "+c.Consumer+"/"+c.Key); err != nil {
			return err
		}
		err = op.Resolve(ctx, repository.ResolveParams{Consumer: c.Consumer, Key: stored, ExpectedOwner: owner, Action: action, Result: result, Now: time.Now()})
		switch {
		case errors.Is(err, repository.ErrLeaseLost):
			return fmt.Errorf("not resolved: the record changed since it was read (reclaimed, completed or its lease renewed): %w", err)
		case errors.Is(err, repository.ErrNotFound):
			return fmt.Errorf("not resolved: the record is gone: %w", err)
		case err != nil:
			return err
		}
		if g.JSON {
			return printJSON(g.stdout, map[string]string{"consumer": c.Consumer, "key": c.Key, "action": action.String(), "lease_owner": owner})
		}
		fmt.Fprintf(g.stdout, "resolved %s/%s: %s\n", c.Consumer, c.Key, action)
		return nil
	})
}

// findStuck finds the stuck record of consumer whose stored key is
// stored (the hashed form of a long key, which Reader.Get cannot look up).
func findStuck(ctx context.Context, op repository.Operator, consumer, stored string) (repository.Record, error) {
	recs, err := op.ListStuck(ctx, repository.ListStuckParams{Consumer: consumer, Now: time.Now(), Limit: maxStuckScan})
	if err != nil {
		return repository.Record{}, err
	}
	for _, r := range recs {
		if r.Key == stored {
			return r, nil
		}
	}
	return repository.Record{}, repository.ErrNotFound
}

// maxStuckScan bounds the stuck records findStuck reads.
const maxStuckScan = 1 << 20

// readResult reads the output messages of --result; none without a file.
func readResult(path string) ([]*message.Message, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--result: %v", err)
	}
	// A payload that is not text goes base64-encoded in payload_base64,
	// the way deadletters show --json prints one.
	var in []struct {
		UUID          string            `json:"uuid"`
		Metadata      map[string]string `json:"metadata"`
		Payload       *string           `json:"payload"`
		PayloadBase64 []byte            `json:"payload_base64"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, usagef("--result %s: want a JSON array of {\"uuid\", \"metadata\", \"payload\" or \"payload_base64\"}: %v", path, err)
	}
	msgs := make([]*message.Message, len(in))
	for i, m := range in {
		if m.UUID == "" {
			return nil, usagef("--result %s: message %d has no uuid", path, i)
		}
		payload := m.PayloadBase64
		if m.Payload != nil {
			if m.PayloadBase64 != nil {
				return nil, usagef("--result %s: message %d gives both payload and payload_base64", path, i)
			}
			payload = []byte(*m.Payload)
		}
		msgs[i] = message.NewMessage(m.UUID, payload)
		for k, v := range m.Metadata {
			msgs[i].Metadata.Set(k, v)
		}
	}
	return msgs, nil
}

// ---- purge ----

// PurgeCmd deletes expired records.
type PurgeCmd struct {
	Expired   bool          `help:"Delete records whose retention expired: what purge does, with or without this flag (kept for scripts)."`
	BatchSize int           `help:"Records deleted per statement." default:"1000"`
	Before    time.Time     `help:"Delete records that expired before this time (RFC 3339). Default: now." format:"2006-01-02T15:04:05Z07:00"`
	Every     time.Duration `help:"Least time between progress lines." default:"1s"`
}

// Run implements the command.
func (c *PurgeCmd) Run(ctx context.Context, g *Globals) error {
	if c.BatchSize <= 0 {
		return usagef("--batch-size must be positive")
	}
	return withStore(ctx, g, func(s *store) error {
		cl, err := s.cleaner()
		if err != nil {
			return err
		}
		if s.kind == kindRedis {
			fmt.Fprintln(g.stdout, "redis deletes expired records itself (key TTL): nothing to purge")
			return nil
		}
		before := c.Before
		if before.IsZero() {
			before = time.Now()
		}
		total, err := s.countExpired(ctx, before)
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "table %s: %s expired before %s\n", s.table, count(total, "record"), stamp(before))
		if s.partitioned {
			return c.dropPartitions(ctx, g, s, cl, before, total)
		}
		if total == 0 {
			return c.report(g, 0, 0, time.Duration(0))
		}
		if err := confirm(g, fmt.Sprintf("delete %s from %s", count(total, "expired record"), s.table)); err != nil {
			return err
		}
		start, last := time.Now(), time.Time{}
		deleted := 0
		for {
			n, err := cl.DeleteExpired(ctx, before, c.BatchSize)
			deleted += n
			if err != nil {
				return fmt.Errorf("purge stopped after %s: %w", count(deleted, "record"), err)
			}
			if now := time.Now(); n < c.BatchSize || now.Sub(last) >= c.Every {
				last = now
				elapsed := now.Sub(start)
				rate := float64(deleted) / max(elapsed.Seconds(), 1e-9)
				eta := "-"
				if left := total - deleted; left > 0 && rate > 0 {
					eta = (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second).String()
				}
				fmt.Fprintf(g.stderr, "deleted %d/%d (%.0f%%), %.0f rows/s, ETA %s\n",
					deleted, total, 100*float64(deleted)/float64(max(total, deleted)), rate, eta)
			}
			if n < c.BatchSize {
				return c.report(g, deleted, total, time.Since(start))
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("purge interrupted after %s: %w", count(deleted, "record"), err)
			}
		}
	})
}

// dropPartitions purges the partitioned layout: one DeleteExpired drops
// every partition whose whole range ended before before; the expired
// records of the partition holding before stay until it has passed too.
func (c *PurgeCmd) dropPartitions(ctx context.Context, g *Globals, s *store, cl repository.Cleaner, before time.Time, total int) error {
	fmt.Fprintf(g.stderr, "partitioned layout: drops the partitions that ended before %s; expired records of the partition holding that time stay until it ends\n", stamp(before))
	if err := confirm(g, "drop the expired partitions of "+s.table); err != nil {
		return err
	}
	start := time.Now()
	n, err := cl.DeleteExpired(ctx, before, c.BatchSize)
	if err != nil {
		return fmt.Errorf("purge stopped after %s: %w", count(n, "record"), err)
	}
	return c.report(g, n, total, time.Since(start))
}

func (c *PurgeCmd) report(g *Globals, deleted, total int, took time.Duration) error {
	if g.JSON {
		return printJSON(g.stdout, map[string]any{"deleted": deleted, "expired_before_start": total, "seconds": took.Seconds()})
	}
	fmt.Fprintf(g.stdout, "deleted %s in %s\n", count(deleted, "expired record"), took.Round(time.Millisecond))
	return nil
}

// ---- dead letters ----

// DeadlettersCmd groups the dead-letter commands.
type DeadlettersCmd struct {
	List    DLListCmd    `cmd:"" help:"List dead letters (id order)."`
	Show    DLShowCmd    `cmd:"" help:"Show one dead letter with its payload and metadata (with --json, the payload base64-encoded as payload_base64)."`
	Requeue DLRequeueCmd `cmd:"" help:"Move dead letters back into the outbox; the relay publishes them again."`
}

// DLListCmd lists dead letters.
type DLListCmd struct {
	Topic string `help:"Only this topic."`
	After int64  `help:"List ids after this one (paging)."`
	Limit int    `help:"Most dead letters listed." default:"100"`
}

// deadLetterJSON is a dead letter as --json prints it. The payload is
// bytes, not text: JSON strings cannot carry every byte (encoding/json
// turns invalid UTF-8 into U+FFFD), so it is printed base64-encoded (a
// []byte field) under payload_base64, and decodes to the exact bytes
// stored. Metadata is the JSON the relay stored; bytes that are not JSON
// are printed under metadata_base64 instead.
type deadLetterJSON struct {
	ID             int64           `json:"id"`
	OutboxID       int64           `json:"outbox_id"`
	Topic          string          `json:"topic"`
	UUID           string          `json:"uuid"`
	Attempts       int             `json:"attempts"`
	LastError      string          `json:"last_error"`
	CreatedAt      time.Time       `json:"created_at"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	MetadataBase64 []byte          `json:"metadata_base64,omitzero"`
	PayloadBase64  []byte          `json:"payload_base64,omitzero"` // "" for an empty payload; absent from list
}

func toJSON(l outbox.DeadLetter, full bool) deadLetterJSON {
	j := deadLetterJSON{ID: l.ID, OutboxID: l.OutboxID, Topic: l.Topic, UUID: l.UUID, Attempts: l.Attempts,
		LastError: l.LastError, CreatedAt: l.CreatedAt.UTC(), DeadLetteredAt: l.DeadLetteredAt.UTC()}
	if full {
		j.PayloadBase64 = append([]byte{}, l.Payload...) // non-nil: show prints an empty payload as ""
		if json.Valid(l.Metadata) {
			j.Metadata = l.Metadata
		} else {
			j.MetadataBase64 = l.Metadata
		}
	}
	return j
}

// printable is b as the table shows it: the text itself when b is UTF-8
// without control characters other than white space, else its base64
// encoding, marked as such.
func printable(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return unicode.IsControl(r) && !unicode.IsSpace(r) }) {
		return string(b)
	}
	return fmt.Sprintf("(%s, base64) %s", count(len(b), "byte"), base64.StdEncoding.EncodeToString(b))
}

// oneLine is s on one line, cut after n bytes (at a character boundary).
func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return s[:n] + "…"
	}
	return s
}

// Run implements the command.
func (c *DLListCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		dl, err := s.deadLetters()
		if err != nil {
			return err
		}
		ls, err := dl.List(ctx, outbox.ListParams{AfterID: c.After, Topic: c.Topic, Limit: c.Limit})
		if err != nil {
			return err
		}
		out := make([]deadLetterJSON, len(ls))
		for i, l := range ls {
			out[i] = toJSON(l, false)
		}
		if g.JSON {
			return printJSON(g.stdout, out)
		}
		if len(out) == 0 {
			fmt.Fprintln(g.stdout, "no dead letters")
			return nil
		}
		now := time.Now()
		rows := make([][]string, len(out))
		for i, l := range out {
			rows[i] = []string{fmt.Sprint(l.ID), l.Topic, l.UUID, fmt.Sprint(l.Attempts), ago(l.DeadLetteredAt, now), oneLine(l.LastError, 60)}
		}
		return table(g.stdout, "ID\tTOPIC\tUUID\tATTEMPTS\tDEAD_LETTERED\tLAST_ERROR", rows)
	})
}

// getDeadLetter reads the dead letter id.
func getDeadLetter(ctx context.Context, dl *outbox.DeadLetters, id int64) (outbox.DeadLetter, error) {
	ls, err := dl.List(ctx, outbox.ListParams{AfterID: id - 1, Limit: 1})
	if err != nil {
		return outbox.DeadLetter{}, err
	}
	if len(ls) == 0 || ls[0].ID != id {
		return outbox.DeadLetter{}, usagef("no dead letter with id %d", id)
	}
	return ls[0], nil
}

// DLShowCmd shows one dead letter.
type DLShowCmd struct {
	ID int64 `arg:"" help:"Dead letter id, as list prints it."`
}

// Run implements the command.
func (c *DLShowCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		dl, err := s.deadLetters()
		if err != nil {
			return err
		}
		l, err := getDeadLetter(ctx, dl, c.ID)
		if err != nil {
			return err
		}
		j := toJSON(l, true)
		if g.JSON {
			return printJSON(g.stdout, j)
		}
		return table(g.stdout, "FIELD\tVALUE", [][]string{
			{"id", fmt.Sprint(j.ID)}, {"outbox_id", fmt.Sprint(j.OutboxID)}, {"topic", j.Topic}, {"uuid", j.UUID},
			{"attempts", fmt.Sprint(j.Attempts)}, {"last_error", oneLine(j.LastError, 500)},
			{"created_at", stamp(j.CreatedAt)}, {"dead_lettered_at", stamp(j.DeadLetteredAt)},
			{"metadata", oneLine(printable(l.Metadata), 2000)}, {"payload", oneLine(printable(l.Payload), 2000)},
		})
	})
}

// DLRequeueCmd requeues dead letters.
type DLRequeueCmd struct {
	IDs []int64 `arg:"" name:"id" help:"Dead letter ids."`
}

// Run implements the command.
func (c *DLRequeueCmd) Run(ctx context.Context, g *Globals) error {
	if len(c.IDs) > outbox.MaxDeadLetterIDs {
		return usagef("at most %d ids per call", outbox.MaxDeadLetterIDs)
	}
	return withStore(ctx, g, func(s *store) error {
		dl, err := s.deadLetters()
		if err != nil {
			return err
		}
		for _, id := range c.IDs {
			l, err := getDeadLetter(ctx, dl, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "dead letter %d: topic %s, uuid %s, %s, last error: %s\n", l.ID, l.Topic, l.UUID, count(l.Attempts, "attempt"), oneLine(l.LastError, 120))
		}
		if err := confirm(g, fmt.Sprintf("requeue %s into %s", count(len(c.IDs), "dead letter"), s.outbox.Table)); err != nil {
			return err
		}
		n, err := dl.Requeue(ctx, c.IDs...)
		if err != nil {
			return err
		}
		if g.JSON {
			return printJSON(g.stdout, map[string]int{"requeued": n})
		}
		fmt.Fprintf(g.stdout, "requeued %d of %s\n", n, count(len(c.IDs), "dead letter"))
		return nil
	})
}

// ---- migrate ----

// noMigrateDown is why idemctl has no migrate down, for migrate's help.
const noMigrateDown = `There is no "migrate down", on purpose. The shipped .down.sql files (for
migration tools that require them) drop the inbox table, and with it the
markers of the messages already processed: every redelivery of one of them
would then run its handler again, the duplicate effect the inbox exists to
prevent. To undo a migration, restore a backup, or write the reverse by
hand knowing which markers it drops.`

// Help implements kong.HelpProvider: migrate --help says why there is no down.
func (MigrateCmd) Help() string { return noMigrateDown }

// Help implements kong.HelpProvider: migrate up --help says why there is no down.
func (MigrateUpCmd) Help() string { return noMigrateDown }

// Help implements kong.HelpProvider: migrate status --help gives its exit status.
func (MigrateStatusCmd) Help() string {
	return `Exit status: 0 when every table listed is up to date; 3 while a migration
is pending (the list, or --json, is printed all the same); 1 when the store
cannot be read; 2 on a usage error. A deploy step can gate on it:

    idemctl migrate status --outbox >/dev/null
    # 0: start the new version; 3: run idemctl migrate up --outbox first`
}

// MigrateCmd groups the migration commands.
type MigrateCmd struct {
	Up     MigrateUpCmd     `cmd:"" help:"Apply the pending migrations of the inbox table (and, with --outbox/--versions, of the outbox and version guard tables)."`
	Status MigrateStatusCmd `cmd:"" help:"List the migrations of the inbox table (and, with --outbox/--versions, the outbox and version guard tables), applied and pending; exit status 3 while one is pending."`
}

// migrationLines names the tables migrate works on.
type migrationLines struct {
	Inbox    bool `help:"The inbox table (--table; --no-inbox to leave it out)." default:"true" negatable:""`
	Outbox   bool `help:"Also the outbox table and its dead-letter table (--outbox-table)."`
	Versions bool `help:"Also the version guard's table (--versions-table)."`
}

// lines returns the migration lines asked for, inbox first.
func (m migrationLines) lines(s *store) ([]migrationLine, error) {
	if s.db == nil {
		return nil, nil
	}
	var out []migrationLine
	for _, want := range []struct {
		on   bool
		line func() (migrationLine, error)
	}{{m.Inbox, s.inboxLine}, {m.Outbox, s.outboxLine}, {m.Versions, s.versionsLine}} {
		if !want.on {
			continue
		}
		l, err := want.line()
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		return nil, usagef("--no-inbox without --outbox or --versions: nothing to migrate")
	}
	return out, nil
}

// MigrateUpCmd migrates.
type MigrateUpCmd struct {
	migrationLines
}

type migrationJSON struct {
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
	Seconds   float64    `json:"seconds,omitempty"`
}

// Run implements the command.
func (c *MigrateUpCmd) Run(ctx context.Context, g *Globals) error {
	g.createSQLite = true
	return withStore(ctx, g, func(s *store) error {
		lines, err := c.lines(s)
		if err != nil {
			return err
		}
		if lines == nil {
			fmt.Fprintf(g.stdout, "%s needs no migration\n", s.kind)
			return nil
		}
		// JSON: {"inbox": table, "applied": [...], "outbox": table,
		// "outbox_applied": [...], "versions": ..., "versions_applied": ...}.
		out := map[string]any{}
		for _, l := range lines {
			start := time.Now()
			applied, err := l.up(ctx)
			if err != nil {
				return fmt.Errorf("%s table %s: %w", l.label, l.table, err)
			}
			took := time.Since(start)
			js := []migrationJSON{}
			for _, a := range applied {
				js = append(js, migrationJSON{Version: a.Version, Name: a.Name, Seconds: a.Duration.Seconds()})
			}
			key := l.label + "_applied"
			if l.label == "inbox" {
				key = "applied"
			}
			out[l.label], out[key] = l.table, js
			if g.JSON {
				continue
			}
			untimed := false
			for _, a := range applied {
				if a.Duration == 0 { // outbox.Migrate reports no time per migration
					untimed = true
					fmt.Fprintf(g.stdout, "applied %04d_%s to %s\n", a.Version, a.Name, l.table)
					continue
				}
				fmt.Fprintf(g.stdout, "applied %04d_%s to %s in %s\n", a.Version, a.Name, l.table, a.Duration.Round(time.Millisecond))
			}
			layout, total := "", ""
			if l.line == "partitioned_inbox" {
				layout = " (partitioned)"
			}
			if untimed {
				total = " (migrated in " + took.Round(time.Millisecond).String() + ")"
			}
			fmt.Fprintf(g.stdout, "%s table %s%s: up to date%s\n", l.label, l.table, layout, total)
		}
		if g.JSON {
			return printJSON(g.stdout, out)
		}
		return nil
	})
}

// MigrateStatusCmd reports the schema.
type MigrateStatusCmd struct {
	migrationLines
}

type lineStatusJSON struct {
	Table      string          `json:"table"`
	Migrations []migrationJSON `json:"migrations"`
	Pending    int             `json:"pending"`
}

// Run implements the command.
func (c *MigrateStatusCmd) Run(ctx context.Context, g *Globals) error {
	return withStore(ctx, g, func(s *store) error {
		lines, err := c.lines(s)
		if err != nil {
			return err
		}
		if lines == nil {
			fmt.Fprintf(g.stdout, "%s needs no migration\n", s.kind)
			return nil
		}
		// JSON: the inbox's fields at the top ("inbox", "migrations",
		// "pending"), the others' under their label.
		out := map[string]any{}
		var pending []string // "2 migrations pending on inbox table T"
		for i, l := range lines {
			files, err := migrationFiles(l)
			if err != nil {
				return err
			}
			applied, err := s.appliedMigrations(ctx, l)
			if err != nil {
				return err
			}
			st := lineStatusJSON{Table: l.table, Migrations: []migrationJSON{}}
			rows := [][]string{}
			for _, f := range files {
				m := migrationJSON{Version: f.Version, Name: f.Name}
				state := "pending"
				if at, ok := applied[f.Version]; ok {
					at := at.UTC()
					m.AppliedAt, state = &at, "applied "+stamp(at)
				} else {
					st.Pending++
				}
				st.Migrations = append(st.Migrations, m)
				rows = append(rows, []string{fmt.Sprintf("%04d", f.Version), f.Name, state})
			}
			if st.Pending > 0 {
				pending = append(pending, fmt.Sprintf("%s pending on %s table %s", count(st.Pending, "migration"), l.label, l.table))
			}
			if l.label == "inbox" {
				out["inbox"], out["migrations"], out["pending"] = l.table, st.Migrations, st.Pending
				if s.partitioned {
					out["layout"] = layoutPartitioned
				}
			} else {
				out[l.label] = st
			}
			if g.JSON {
				continue
			}
			if i > 0 {
				fmt.Fprintln(g.stdout)
			}
			layout := ""
			if l.line != l.label {
				layout = " (" + l.line + ")"
			}
			fmt.Fprintf(g.stdout, "%s table %s%s: %d pending\n", l.label, l.table, layout, st.Pending)
			if err := table(g.stdout, "VERSION\tNAME\tSTATUS", rows); err != nil {
				return err
			}
		}
		if g.JSON {
			if err := printJSON(g.stdout, out); err != nil {
				return err
			}
		}
		if len(pending) > 0 {
			return exitStatus{fmt.Errorf("not up to date: %s; run idemctl migrate up with the same flags", strings.Join(pending, ", ")), exitPending}
		}
		return nil
	})
}
