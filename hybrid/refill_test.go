package hybrid

import (
	"strconv"
	"sync"
	"testing"
)

// TestRefillQueueDropsNothing: entries pushed from several goroutines, far
// more than one batch, are each popped once, in batches of at most
// refillBatch, after a wake-up (its worker pops until the queue is empty).
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
	select {
	case <-q.wake:
	default:
		t.Fatalf("no wake-up after %d pushes", n)
	}
	seen := make(map[*entry]int, n)
	var batch []*entry
	for {
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
	l := &limiter{}
	for i := range l.queues {
		l.queues[i] = newRefillQueue()
	}
	e := new(entry)
	q := l.queues[l.queueOf(e)]
	for range 3 {
		l.refill(e)
	}
	if got := len(q.waiting); got != 1 {
		t.Fatalf("three refills of one entry queued %d items, want 1", got)
	}
	q.pop(nil)
	l.refilled(e)
	l.refill(e)
	if got := len(q.waiting); got != 1 {
		t.Errorf("a refill after the last one ended queued %d items, want 1", got)
	}
}

// TestRefillersShareNoKeyLock: the keys of different refill queues never
// share a key lock, so that the refillers' batches, which hold their keys'
// locks while they wait for Redis, are in flight together.
func TestRefillersShareNoKeyLock(t *testing.T) {
	l := &limiter{}
	owner := make(map[int]int) // key lock -> queue
	queues := make(map[int]bool)
	for i := range 10_000 {
		e := &entry{key: "k" + strconv.Itoa(i)}
		q, lock := l.queueOf(e), l.keyLockIndex(e.key)
		if q < 0 || q >= refillers {
			t.Fatalf("queueOf(%q) = %d, want 0 to %d", e.key, q, refillers-1)
		}
		if was, ok := owner[lock]; ok && was != q {
			t.Fatalf("key lock %d is held by keys of queues %d and %d", lock, was, q)
		}
		owner[lock] = q
		queues[q] = true
	}
	if len(queues) != refillers {
		t.Errorf("10,000 keys went to %d queues, want all %d", len(queues), refillers)
	}
}
