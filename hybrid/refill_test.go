package hybrid

import (
	"sync"
	"testing"
)

// TestRefillQueueDropsNothing: entries pushed from several goroutines, far
// more than one batch, are each popped once, in batches of at most
// refillBatch, and the queue wakes a worker while it holds any.
func TestRefillQueueDropsNothing(t *testing.T) {
	const n = 5*refillBatch + 17
	q := newRefillQueue()
	es := make([]*entry, n)
	for i := range es {
		es[i] = new(entry)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				q.push(es[i])
			}
		})
	}
	wg.Wait()
	seen := make(map[*entry]int, n)
	var batch []*entry
	for {
		select {
		case <-q.wake:
		default:
			t.Fatalf("after %d of %d entries popped: no wake-up while the queue holds some", len(seen), n)
		}
		batch = q.pop(batch)
		if len(batch) == 0 || len(batch) > refillBatch {
			t.Fatalf("a batch of %d, want 1 to %d", len(batch), refillBatch)
		}
		for _, e := range batch {
			seen[e]++
		}
		if len(seen) == n {
			break
		}
	}
	for i, e := range es {
		if seen[e] != 1 {
			t.Errorf("entry %d popped %d times, want 1", i, seen[e])
		}
	}
	if got := q.pop(batch); len(got) != 0 {
		t.Errorf("the emptied queue popped %d more", len(got))
	}
}

// TestRefillQueuesAnEntryOnce: a refill asked for again while one is queued
// queues nothing more (refillDone), so the queue holds at most one item per
// key, and a refilled entry may be queued again.
func TestRefillQueuesAnEntryOnce(t *testing.T) {
	l := &limiter{queue: newRefillQueue()}
	e := new(entry)
	for range 3 {
		l.refill(e)
	}
	if got := len(l.queue.waiting); got != 1 {
		t.Fatalf("three refills of one entry queued %d items, want 1", got)
	}
	l.queue.pop(nil)
	l.refilled(e)
	l.refill(e)
	if got := len(l.queue.waiting); got != 1 {
		t.Errorf("a refill after the last one ended queued %d items, want 1", got)
	}
}
