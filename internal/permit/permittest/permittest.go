// Package permittest checks what every tier's permits promise on Release:
// idempotent, harmless on the zero Permit and after Close, and a stale
// copy never releasing a later holder's permit.
package permittest

import (
	"context"
	"reflect"
	"testing"

	"github.com/tierlimit/tierlimit"
)

// Limiter is a Concurrency limiter under test.
type Limiter interface {
	tierlimit.Concurrency
	Stats() tierlimit.ConcurrencyStats
	Close() error
}

// Release runs the checks on c, a limiter of one permit per key with no
// permit of key out, and closes it.
func Release(t *testing.T, c Limiter, key string) {
	t.Helper()
	ctx := context.Background()
	var zero tierlimit.Permit
	zero.Release() // harmless
	if zero.Valid() {
		t.Error("the zero Permit is Valid, want not")
	}
	inUse := func(want int64, after string) {
		t.Helper()
		if got := c.Stats().InUse; got != want {
			t.Errorf("Stats().InUse after %s = %d, want %d", after, got, want)
		}
	}

	p, ok, err := c.TryAcquire(ctx, key)
	if !ok || err != nil || !p.Valid() {
		t.Fatalf("TryAcquire(%q) = %v, %v, %v; want a permit", key, p, ok, err)
	}
	stale := p
	p.Release()
	p.Release()
	inUse(0, "Release twice")

	// The next permit takes the released one's record, with a new
	// generation: the stale copy's Release must not free it.
	q, ok, err := c.TryAcquire(ctx, key)
	if !ok || err != nil {
		t.Fatalf("TryAcquire(%q) after Release = %v, %v; want a permit", key, ok, err)
	}
	if id(q) != id(stale) || gen(q) == gen(stale) {
		t.Errorf("permit after Release: id %d generation %d, want the released one's id %d with a new generation (not %d)",
			id(q), gen(q), id(stale), gen(stale))
	}
	stale.Release()
	inUse(1, "a stale copy's Release")
	if _, ok, err := c.TryAcquire(ctx, key); ok || err != nil {
		t.Errorf("TryAcquire(%q) after a stale copy's Release = %v, %v; want false, nil: it freed the new holder's permit", key, ok, err)
	}
	q.Release()
	inUse(0, "the holder's Release")

	r, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire(%q) = %v, want a permit", key, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	r.Release() // after Close: valid, given back
	r.Release()
	inUse(0, "Release after Close")
}

// id and gen read a Permit's fields: its record's index and generation.
func id(p tierlimit.Permit) uint64  { return reflect.ValueOf(p).FieldByName("id").Uint() }
func gen(p tierlimit.Permit) uint64 { return reflect.ValueOf(p).FieldByName("gen").Uint() }
