package hybrid

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/permit/permittest"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
)

func TestPermitRelease(t *testing.T) {
	c, err := NewConcurrency(redistest.Start(t).Client(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	permittest.Release(t, c, "k")
}

// TestPermitReleaseExpired: a permit whose block Redis lost is recorded
// again by the next renewal (it is in flight), and released in process
// once, harmlessly.
func TestPermitReleaseExpired(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	c, _ := NewConcurrency(rdb, 2, WithPermitTTL(60*time.Millisecond))
	defer c.Close()
	// Acquire, not TryAcquire: the first claim loads the script.
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := c.Acquire(wait, "k")
	if err != nil {
		t.Fatalf("Acquire = %v; want a permit", err)
	}
	keys := store.PermitKeys(store.DefaultPrefix, "k")
	rdb.Del(ctx, keys...)
	for deadline := time.Now().Add(2 * time.Second); rdb.Exists(ctx, keys...).Val() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal recorded the permit out again")
		}
	}
	if got := redisTotal(t, rdb, "k"); got != 1 {
		t.Errorf("Redis records %d permits after the renewal, want the 1 out", got)
	}
	p.Release()
	p.Release()
	if st := c.Stats(); st.InUse != 0 {
		t.Errorf("Stats().InUse after Release of an expired permit = %d, want 0", st.InUse)
	}
}

// TestPermitAllocs: a TryAcquire and Release on a warm key allocate
// nothing.
func TestPermitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	c, _ := NewConcurrency(redistest.Start(t).Client(t), 4)
	defer c.Close()
	permittest.Allocs(t, c, "TryAcquire+Release on a warm key")
}
