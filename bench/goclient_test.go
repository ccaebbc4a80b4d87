package main

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// FGR's batcher runs full batches at once, a batch that cannot fill
// after its wait, and hands every delivery its batch's error.
func TestPlainBatcher(t *testing.T) {
	var (
		mu    sync.Mutex
		sizes []int
	)
	boom := errors.New("boom")
	pb := &plainBatcher{k: 3, wait: time.Minute, run: func(msgs []*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(msgs))
		if slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.UUID == "fail" }) {
			return boom
		}
		return nil
	}}
	var wg sync.WaitGroup
	errs := make([]error, 6)
	handleAll := func(ids ...string) {
		t.Helper()
		clear(errs)
		sizes = nil
		for i, id := range ids {
			wg.Go(func() { _, errs[i] = pb.handle(message.NewMessage(id, nil)) })
		}
		wg.Wait()
	}

	// Six at once: two full batches, whenever each arrives (the wait is
	// longer than the test).
	handleAll("1", "2", "3", "4", "5", "6")
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sizes, []int{3, 3}) {
		t.Fatalf("batch sizes %v, want 3, 3", sizes)
	}

	// One alone runs when its wait runs out.
	pb.wait = 10 * time.Millisecond
	handleAll("7")
	if errs[0] != nil || !slices.Equal(sizes, []int{1}) {
		t.Fatalf("error %v, batch sizes %v, want one batch of 1", errs[0], sizes)
	}

	// A failing batch fails each of its deliveries.
	pb.wait = time.Minute
	handleAll("a", "fail", "b")
	for i := range 3 {
		if !errors.Is(errs[i], boom) {
			t.Fatalf("delivery %d: %v, want the batch's error", i, errs[i])
		}
	}
	if !slices.Equal(sizes, []int{3}) {
		t.Fatalf("batch sizes %v, want 3", sizes)
	}
}
