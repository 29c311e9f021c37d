package tierlimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/evict"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestEvictionAdmissions measures what eviction does to the limits: for
// each maxmemory-policy, a Redis with a 16 MB maxmemory shared with a cache
// that keeps writing (4 KiB values with a one-hour TTL), and each limiter
// on one key at 1000/s saturated by 8 goroutines for 3 s: admitted over one
// bucket's bound (burst + rate x time), and the keys evicted meanwhile.
// It prints the table of docs/operations.md, whose last column is what the
// limiters reported of the server right after New (Eviction,
// Stats.Eviction), and fails when one reports other than its policy
// implies: a risky policy unreported, a safe one called risky, or unknown.
// It takes about a minute, so
// it runs only with TIERLIMIT_EVICTION_TABLE=1:
//
//	TIERLIMIT_EVICTION_TABLE=1 go test -run TestEvictionAdmissions -v .
func TestEvictionAdmissions(t *testing.T) {
	if os.Getenv("TIERLIMIT_EVICTION_TABLE") == "" {
		t.Skip("set TIERLIMIT_EVICTION_TABLE=1 to measure admissions under eviction (about a minute)")
	}
	const d = 3 * time.Second
	limit := tierlimit.PerSecond(1000)
	// The columns of docs/operations.md's table: the bucket tiers that
	// use Redis, and the sliding log, whose key grows with its rate.
	var limiters []tier
	for _, tier := range tiers {
		if tier.redis && (!tier.window || tier.name == "remote sliding log") {
			limiters = append(limiters, tier)
		}
	}
	var table strings.Builder
	fmt.Fprintf(&table, "| policy |")
	for _, l := range limiters {
		fmt.Fprintf(&table, " %s |", l.name)
	}
	fmt.Fprintf(&table, " keys evicted per second | reported at New |\n|---|%s---:|---|\n", strings.Repeat("---:|", len(limiters)))
	for _, policy := range []string{"none (no maxmemory)", "noeviction", "allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-lfu", "volatile-ttl"} {
		args := []string{"--maxmemory", "16mb", "--maxmemory-policy", policy}
		if strings.HasPrefix(policy, "none") {
			args = nil
		}
		s := redistest.Start(t, args...)
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		stop := fillCache(rdb)
		fmt.Fprintf(&table, "| %s |", policy)
		var evicted int64
		// The last column is what the limiters themselves reported right
		// after New: one word when they agree, each one's otherwise.
		risky := policy != "noeviction" && !strings.HasPrefix(policy, "none")
		var reports []string
		agree := true
		for i, lt := range limiters {
			before, _ := evict.Read(context.Background(), rdb)
			lim, err := lt.new(rdb, limit, tierOptions{})
			if errors.Is(err, tierlimit.ErrMisconfigured) {
				fmt.Fprintf(&table, " ErrMisconfigured at New |")
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			reported := evictionOf(lim)
			word := map[bool]string{true: "risky", false: "safe"}[reported.Risky()]
			if !reported.Known() {
				word = "unknown"
			}
			agree = agree && (len(reports) == 0 || strings.HasSuffix(reports[0], ": "+word))
			reports = append(reports, lt.name+": "+word)
			if !reported.Known() || reported.Risky() != risky {
				t.Errorf("%s, %s: reported at New %v (Known %v, Risky %v); want known and Risky %v",
					policy, lt.name, reported, reported.Known(), reported.Risky(), risky)
			}
			admitted, calls, errs := saturate(lim, "hot"+strconv.Itoa(i), d)
			lim.Close()
			after, _ := evict.Read(context.Background(), rdb)
			evicted += after.EvictedKeys - before.EvictedKeys
			bound := limit.Capacity() + limit.Rate*int64(d/time.Second)
			cell := fmt.Sprintf("%.2f×", float64(admitted)/float64(bound))
			if errs > 0 {
				cell += fmt.Sprintf(" (%d%% errors)", 100*errs/(errs+calls))
			}
			fmt.Fprintf(&table, " %s |", cell)
			t.Logf("%s, %s: %d admitted, bound %d, %d errors", policy, lt.name, admitted, bound, errs)
		}
		col := strings.Join(reports, ", ")
		if agree && len(reports) > 0 {
			_, col, _ = strings.Cut(reports[0], ": ")
		}
		fmt.Fprintf(&table, " %d | %s |\n", evicted/int64(len(limiters))/int64(d/time.Second), col)
		stop()
		rdb.Close()
	}
	t.Logf("admitted / one bucket's bound, 1000/s on one key, %v, 8 goroutines, 16 MB maxmemory with a cache writing beside:\n%s", d, table.String())
}

// fillCache writes 4 KiB values with a one-hour TTL under random keys from
// two goroutines, as a cache sharing the instance would, until stop.
func fillCache(rdb *redis.Client) (stop func()) {
	var wg sync.WaitGroup
	var done atomic.Bool
	value := strings.Repeat("v", 4096)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load() && i < 10_000_000; i++ {
				rdb.Set(context.Background(), "cache:"+strconv.FormatUint(rand.Uint64(), 36), value, time.Hour)
			}
		}()
	}
	return func() { done.Store(true); wg.Wait() }
}

// saturate calls l.Allow on key from 8 goroutines for d and returns the
// admitted calls, the decisions and the errors.
func saturate(l tierlimit.Limiter, key string, d time.Duration) (admitted, decided, errs int64) {
	var wg sync.WaitGroup
	var a, n, e atomic.Int64
	end := time.Now().Add(d)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				res, err := l.AllowN(context.Background(), key, 1)
				switch {
				case err != nil:
					e.Add(1)
					time.Sleep(time.Millisecond)
				case res.Allowed:
					a.Add(1)
					n.Add(1)
				default:
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return a.Load(), n.Load(), e.Load()
}
