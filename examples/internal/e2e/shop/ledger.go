package shop

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// Outcomes counts an inbox's deliveries by outcome.
type Outcomes map[idempotency.Outcome]int

// Total is the number of deliveries the inbox saw.
func (o Outcomes) Total() int {
	n := 0
	for _, c := range o {
		n += c
	}
	return n
}

// Duplicates is the number of deliveries acknowledged without running the
// handler, with or without a replay of stored output.
func (o Outcomes) Duplicates() int {
	return o[idempotency.OutcomeDuplicate] + o[idempotency.OutcomeReplayed]
}

// Ledger is what a Run counted and what the database holds at the end.
type Ledger struct {
	Run, Broker, Database string
	Instances             int  // billing instances competing for the orders
	ViaOutbox             bool // payments went through the outbox and its relay

	Orders      int // orders placed
	Published   int // order messages published, re-sends and bad ones included
	BadMessages int // deliberately bad messages among them

	Billing       Outcomes // billing inbox outcomes, every delivery
	Failures      int      // injected failures (rolled back, redelivered)
	Crashes       int      // injected crashes after commit, before ack (counted in Billing as processed)
	InstancesDown int      // instances a crash took down for good (Kafka); two crashes may hit one
	Restarts      int      // replacement instances started for them

	PaymentsPublished int // payment messages published (relay or router)
	PaymentsDelivered int // payment deliveries the receipts inbox acknowledged
	Receipts          Outcomes
	Poisoned          []string // UUIDs that reached the poison queue, repeats included
	BadUUIDs          []string // UUIDs of the deliberately bad messages ("" has no key)
	OutboxBacklog     int      // rows left in the outbox

	Expected      map[string]CustomerTotals // per customer, from the orders
	Charged       map[string]CustomerTotals // per customer, from the charges table
	ChargedOrders int                       // distinct orders in the charges table
	DoubleCharged int                       // orders with more than one charge
	ReceiptRows   int
	ReceiptOrders int

	Elapsed time.Duration
}

// Resent is the number of order messages the producer published again.
func (l *Ledger) Resent() int { return l.Published - l.Orders - l.BadMessages }

// ChargedOnce reports whether every order was charged exactly once with
// its amount.
func (l *Ledger) ChargedOnce() bool {
	if l.ChargedOrders != l.Orders || l.DoubleCharged != 0 || len(l.Charged) != len(l.Expected) {
		return false
	}
	for c, want := range l.Expected {
		if l.Charged[c] != want {
			return false
		}
	}
	return true
}

// PaymentsComplete reports whether every order's payment reached the
// receipts service and produced one receipt.
func (l *Ledger) PaymentsComplete() bool {
	return l.ReceiptRows == l.Orders && l.ReceiptOrders == l.Orders
}

// PoisonOnlyBad reports whether the poison queue holds the deliberately
// bad messages and nothing else. (A broker may deliver a bad message, and
// so poison it, more than once.)
func (l *Ledger) PoisonOnlyBad() bool {
	bad := map[string]bool{}
	for _, u := range l.BadUUIDs {
		bad[u] = false
	}
	for _, u := range l.Poisoned {
		if _, ok := bad[u]; !ok {
			return false
		}
		bad[u] = true
	}
	for _, seen := range bad {
		if !seen {
			return false
		}
	}
	return len(bad) == l.BadMessages
}

// ExactlyOnce reports whether the run shows effectively-once effects.
func (l *Ledger) ExactlyOnce() bool {
	return l.ChargedOnce() && l.PaymentsComplete() && l.PoisonOnlyBad()
}

// Print writes the ledger summary. Each line's parts add up to its total:
// a crash after commit is one of the processed deliveries, and the broker's
// redelivery of it is one of the duplicates.
func (l *Ledger) Print(w io.Writer) {
	via := "router output (replayed to duplicates)"
	if l.ViaOutbox {
		via = "transactional outbox + relay"
	}
	fmt.Fprintf(w, "run %s: broker %s, database %s, %d competing billing instances, payments via %s\n\n",
		l.Run, l.Broker, l.Database, l.Instances, via)
	fmt.Fprintf(w, "producer  %3d orders published as %d messages: %d re-sent after a lost confirmation, %d deliberately bad\n",
		l.Orders, l.Published, l.Resent(), l.BadMessages)

	b := l.Billing
	processed := b[idempotency.OutcomeProcessed]
	// A commit that went through while a dying instance reported it failed
	// counts as a failure in the inbox's outcomes and as a charge in the
	// database.
	unknown := max(l.ChargedOrders-processed, 0)
	failed := b[idempotency.OutcomeFailed] - unknown
	poisoned := b[idempotency.OutcomeNoKey] + b[idempotency.OutcomePayloadMismatch]
	fmt.Fprintf(w, "billing   %3d deliveries = %d processed + %d failed + %d duplicates + %d poisoned",
		b.Total(), processed, b[idempotency.OutcomeFailed], b.Duplicates(), poisoned)
	if other := b.Total() - processed - b[idempotency.OutcomeFailed] - b.Duplicates() - poisoned; other != 0 {
		fmt.Fprintf(w, " + %d other", other)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "          %3d processed: charged and committed\n", processed)
	if l.Crashes > 0 {
		effect := "no payment published"
		if l.ViaOutbox {
			effect = "the payment already committed to the outbox"
		}
		fmt.Fprintf(w, "              %d of them crashed after the commit, before the ack: %s, the broker redelivered the order",
			l.Crashes, effect)
		if l.InstancesDown > 0 {
			fmt.Fprintf(w, " (%d instances down, %d replaced)", l.InstancesDown, l.Restarts)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "          %3d failed: %d rolled back and redelivered (%d injected, %d interrupted by a crash)",
		b[idempotency.OutcomeFailed], failed, l.Failures, failed-l.Failures)
	if unknown > 0 {
		fmt.Fprintf(w, " + %d reported failed by a dying instance although the commit went through (charged; its redelivery a duplicate)", unknown)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "          %3d duplicates acknowledged without charging: %d re-sent by the producer, %d redelivered after a crash",
		b.Duplicates(), l.Resent(), l.Crashes)
	if other := b.Duplicates() - l.Resent() - l.Crashes; other != 0 {
		fmt.Fprintf(w, ", %d redelivered by the broker otherwise", other)
	}
	fmt.Fprintln(w)
	if l.ViaOutbox {
		fmt.Fprintf(w, "              none replays a payment: the payment was written to the outbox with the charge (%d replayed)\n", b[idempotency.OutcomeReplayed])
	} else {
		fmt.Fprintf(w, "              %d replayed the payment stored with the charge, with its original UUID\n", b[idempotency.OutcomeReplayed])
	}
	fmt.Fprintf(w, "          %3d poisoned: %d without a key, %d reusing a key for other content\n",
		poisoned, b[idempotency.OutcomeNoKey], b[idempotency.OutcomePayloadMismatch])

	if l.ViaOutbox {
		fmt.Fprintf(w, "payments  %3d published by the relay from the outbox, %d delivered to receipts, %d left in the outbox\n",
			l.PaymentsPublished, l.PaymentsDelivered, l.OutboxBacklog)
	} else {
		fmt.Fprintf(w, "payments  %3d published by the router = %d after a charge (%d processed - %d crashed) + %d replayed; %d delivered to receipts\n",
			l.PaymentsPublished, processed-l.Crashes, processed, l.Crashes, b[idempotency.OutcomeReplayed], l.PaymentsDelivered)
	}
	fmt.Fprintf(w, "receipts  %3d deliveries = %d processed + %d duplicates skipped; %d receipts for %d orders\n",
		l.Receipts.Total(), l.Receipts[idempotency.OutcomeProcessed], l.Receipts.Duplicates(), l.ReceiptRows, l.ReceiptOrders)
	if !l.ViaOutbox && l.Crashes > 0 {
		fmt.Fprintf(w, "              (the replays for the %d crashed orders were the first copy of their payment)\n", l.Crashes)
	}
	fmt.Fprintf(w, "poison    %3d messages\n\n", len(l.Poisoned))

	names := make([]string, 0, len(l.Expected))
	for c := range l.Expected {
		names = append(names, c)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "customer   orders  charges     charged    expected")
	for _, c := range names {
		fmt.Fprintf(w, "%-10s %6d  %7d  %10s  %10s\n", c, l.Expected[c].Charges, l.Charged[c].Charges, dollars(l.Charged[c].Cents), dollars(l.Expected[c].Cents))
	}
	fmt.Fprintln(w)
	if l.ExactlyOnce() {
		fmt.Fprintf(w, "every order charged exactly once, every payment delivered downstream, only the deliberate messages poisoned (%s)\n",
			l.Elapsed.Round(10*time.Millisecond))
		return
	}
	if !l.ChargedOnce() {
		fmt.Fprintf(w, "MISMATCH: %d of %d orders charged, %d more than once\n", l.ChargedOrders, l.Orders, l.DoubleCharged)
	}
	if !l.PaymentsComplete() {
		fmt.Fprintf(w, "MISMATCH: %d receipts for %d orders, expected one per order\n", l.ReceiptRows, l.ReceiptOrders)
	}
	if !l.PoisonOnlyBad() {
		fmt.Fprintf(w, "MISMATCH: %d messages poisoned, expected the %d deliberate ones\n", len(l.Poisoned), l.BadMessages)
	}
}

func dollars(cents int) string { return fmt.Sprintf("$%d.%02d", cents/100, cents%100) }

// outcomeCounter is an inbox Observer counting outcomes per Watermill
// handler ("billing") and passing every delivery on to next (metrics), if
// set.
type outcomeCounter struct {
	next idempotency.Observer

	mu     sync.Mutex
	counts map[string]Outcomes
}

func newOutcomeCounter(next idempotency.Observer) *outcomeCounter {
	return &outcomeCounter{next: next, counts: map[string]Outcomes{}}
}

func (c *outcomeCounter) ObserveDelivery(ctx context.Context, d idempotency.Delivery) {
	handler := message.HandlerNameFromCtx(ctx)
	c.mu.Lock()
	if c.counts[handler] == nil {
		c.counts[handler] = Outcomes{}
	}
	c.counts[handler][d.Outcome]++
	c.mu.Unlock()
	if c.next != nil {
		c.next.ObserveDelivery(ctx, d)
	}
}

func (c *outcomeCounter) total(handler string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[handler].Total()
}

func (c *outcomeCounter) snapshot(handler string) Outcomes {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Outcomes{}
	for k, v := range c.counts[handler] {
		out[k] = v
	}
	return out
}
