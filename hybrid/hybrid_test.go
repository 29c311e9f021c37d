package hybrid

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/script"
)

// env is a limiter on miniredis whose server clock and local clock move
// together, only when the test says.
type env struct {
	m      *miniredis.Miniredis
	rdb    *redis.Client
	clock  *clocktest.Clock
	calls  *callcount.Hook
	ctx    context.Context
	bucket tierlimit.Limit
}

func newEnv(t testing.TB) *env {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	calls := &callcount.Hook{}
	rdb.AddHook(calls)
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	m.SetTime(clock.Now())
	return &env{m: m, rdb: rdb, clock: clock, calls: calls, ctx: context.Background()}
}

func (e *env) step(d time.Duration) { e.m.SetTime(e.clock.Add(d)) }

// refilled waits until no background refill of l's is queued or in flight:
// a test that steps the clock lets the refills its calls queued land first.
func refilled(t testing.TB, l *Limiter) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		busy := false
		l.keys.each(func(e *entry) { busy = busy || e.refillDone.Load() != nil })
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a background refill did not end within 5 s")
		}
	}
}

func (e *env) limiter(t testing.TB, limit tierlimit.Limit, opts ...Option) *Limiter {
	t.Helper()
	// A generous budget: under -race, miniredis calls can take longer than
	// the default, and a decision that falls back would upset the tests'
	// ledgers. Tests of the budget set their own.
	l, err := New(e.rdb, limit, append([]Option{WithClock(e.clock), WithCallBudget(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	e.bucket = limit
	return l
}

// level peeks at the tokens Redis holds for key, through a plain bucket.
func (e *env) level(t testing.TB, l *Limiter, key string) int64 {
	t.Helper()
	r, err := l.bucket.AllowN(e.ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r.Remaining
}

// closeAndAudit closes l and checks that its ledger balances with admitted
// tokens spent, that nothing is held or lost, and that Redis holds exactly
// capacity - spent[key] for every key of spent.
func (e *env) closeAndAudit(t testing.TB, l *Limiter, admitted int64, spent map[string]int64) {
	t.Helper()
	e.closeAndAuditAfter(t, l, admitted, spent, false)
}

// closeAndAuditAfter is closeAndAudit, but after steps of the clock past
// leases' records (stepped), when a refund that no janitor sent in time
// gives none back (the ledger's L2): Stats counts those lost, and the keys
// of spent (whose time did not move) still hold exactly capacity - spent.
func (e *env) closeAndAuditAfter(t testing.TB, l *Limiter, admitted int64, spent map[string]int64, stepped bool) {
	t.Helper()
	if err := l.Close(); err != nil && !stepped {
		t.Fatal(err)
	}
	s := l.Stats()
	checkLedger(t, s, admitted)
	if s.Held != 0 || s.Lost != 0 && !stepped {
		t.Errorf("after Close: held %d, lost %d; want 0, 0", s.Held, s.Lost)
	}
	plain := e.limiter(t, l.limit, WithMaxKeys(16))
	for key, n := range spent {
		if got, want := e.level(t, plain, key), l.limit.Capacity()-n; got != want {
			t.Errorf("%s: Redis holds %d, want %d (capacity - spent)", key, got, want)
		}
	}
}

func checkLedger(t testing.TB, s Stats, spent int64) {
	t.Helper()
	if s.Leased != s.Spent+s.Refunded+s.Lost+s.Held {
		t.Errorf("ledger: leased %d != spent %d + refunded %d + lost %d + held %d",
			s.Leased, s.Spent, s.Refunded, s.Lost, s.Held)
	}
	if s.Spent != spent {
		t.Errorf("Stats.Spent = %d, want %d (admitted)", s.Spent, spent)
	}
}

func TestHotKeyLeases(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(1000))
	admitted := int64(0)
	for i := 0; i < 3000; i++ {
		r, err := l.Allow(e.ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
		if i%10 == 0 {
			e.step(time.Millisecond) // demand: 10 per ms, 10x the limit
		}
	}
	// Server time moved 300 ms: at most 1000 + 300 tokens exist.
	if admitted > 1300 {
		t.Errorf("admitted %d > bucket bound 1300", admitted)
	}
	if admitted < 1200 {
		t.Errorf("admitted %d < 1200 (92%% of the bucket bound)", admitted)
	}
	calls := e.calls.Calls()
	t.Logf("3000 decisions, %d admitted, %d Redis calls, stats %+v", admitted, calls, l.Stats())
	if calls > 60 {
		t.Errorf("%d Redis calls for 3000 decisions, want <= 60 (20 per 1000)", calls)
	}
}

func TestBlockedKeyMakesNoRedisCall(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerMinute(5)) // tiny: exact mode
	for i := 0; i < 5; i++ {
		if r, _ := l.Allow(e.ctx, "k"); !r.Allowed {
			t.Fatalf("call %d denied", i)
		}
	}
	r, _ := l.Allow(e.ctx, "k")
	if r.Allowed || r.Source != tierlimit.SourceRemote || r.RetryAfter != 12*time.Second {
		t.Fatalf("6th call = %+v, want denied by remote with RetryAfter 12s", r)
	}
	before := e.calls.Calls()
	for i := 0; i < 100; i++ {
		e.step(100 * time.Millisecond) // 10 s in all, less than RetryAfter
		r, _ := l.Allow(e.ctx, "k")
		if r.Allowed || r.Source != tierlimit.SourceBlocked {
			t.Fatalf("blocked call %d = %+v, want denied locally", i, r)
		}
	}
	if got := e.calls.Calls() - before; got != 0 {
		t.Errorf("%d Redis calls while the key was blocked, want 0", got)
	}
	e.step(2 * time.Second)
	if r, _ := l.Allow(e.ctx, "k"); !r.Allowed || r.Source != tierlimit.SourceRemote {
		t.Errorf("after RetryAfter: %+v, want allowed by remote", r)
	}
}

// TestLedger spends part of several leases, closes the limiter and checks
// that Redis holds exactly capacity - spent for each key.
func TestLedger(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(1000)
	l := e.limiter(t, limit, WithLeaseBounds(50, 100))
	spent := map[string]int64{}
	var total int64
	for i := 0; i < 500; i++ {
		key := fmt.Sprint("k", i%7)
		n := int64(1 + i%3)
		if r, _ := l.AllowN(e.ctx, key, n); r.Allowed {
			spent[key] += n
			total += n
		}
	}
	checkLedger(t, l.Stats(), total)
	e.closeAndAudit(t, l, total, spent)
}

// TestTinyCacheLosesNoTokens forces ristretto to evict and reject entries
// holding leases: every token is refunded.
func TestTinyCacheLosesNoTokens(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(1000)
	l := e.limiter(t, limit, WithMaxKeys(2), WithLeaseBounds(20, 50))
	spent := map[string]int64{}
	var total int64
	for i := 0; i < 2000; i++ {
		key := fmt.Sprint("k", (i*7)%40)
		if r, _ := l.Allow(e.ctx, key); r.Allowed {
			spent[key]++
			total++
		}
	}
	for i := 0; i < 40; i++ {
		spent[fmt.Sprint("k", i)] += 0 // keys never admitted hold full buckets
	}
	e.closeAndAudit(t, l, total, spent)
}

// TestLeaseExpiryRefunds checks that the janitor refunds a lease once its
// TTL passes.
func TestLeaseExpiryRefunds(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(1000)
	l := e.limiter(t, limit, WithLeaseBounds(100, 100), WithLeaseTTL(time.Second))
	if r, _ := l.Allow(e.ctx, "k"); !r.Allowed {
		t.Fatal("denied")
	}
	if got := l.Stats().Held; got != 99 {
		t.Fatalf("held %d, want 99", got)
	}
	// Ticks are real time; expiry is on the clock: the janitor's round
	// after the TTL (it runs every quarter TTL), within the ledger's hold.
	e.step(1250 * time.Millisecond)
	if err := l.refundHeld(e.clock.Now(), false); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Held != 0 || s.Refunded != 99 {
		t.Errorf("after expiry: held %d, refunded %d; want 0, 99", s.Held, s.Refunded)
	}
}

// TestRareKeys: a key asked less often than once per lease TTL finds its
// lease expired at every decision and claims each time (docs/operations.md
// says so); with a lease TTL above its interval, its lease grows and most
// decisions are local.
func TestRareKeys(t *testing.T) {
	const every, asks = 1100 * time.Millisecond, 20
	for _, tc := range []struct {
		ttl                  time.Duration
		minRemote, maxRemote int64 // bounds of the decisions that claimed
	}{
		{time.Second, asks, asks},
		{10 * time.Second, 1, asks / 2},
	} {
		t.Run(tc.ttl.String(), func(t *testing.T) {
			e := newEnv(t)
			l := e.limiter(t, tierlimit.PerSecond(100), WithLeaseTTL(tc.ttl))
			for i := range asks {
				if r, err := l.Allow(e.ctx, "rare"); err != nil || !r.Allowed {
					t.Fatalf("ask %d: %+v, %v", i, r, err)
				}
				// 1.1 s is time enough for a refill to land, but the
				// clock is stepped: a refill still in flight would
				// land after the next ask, which then waits for it
				// (the full -race suite: 12 of 20 claimed).
				refilled(t, l)
				e.step(every)
				if err := l.refundHeld(e.clock.Now(), false); err != nil {
					t.Fatal(err)
				}
			}
			s := l.Stats()
			t.Logf("lease TTL %v, asked every %v: %d of %d decisions claimed", tc.ttl, every, s.Remote, asks)
			if s.Remote < tc.minRemote || s.Remote > tc.maxRemote {
				t.Errorf("%d of %d decisions claimed, want %d to %d (stats %+v)", s.Remote, asks, tc.minRemote, tc.maxRemote, s)
			}
			checkLedger(t, s, asks)
		})
	}
}

func TestResetAndPeek(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(10, 10))
	for i := 0; i < 100; i++ {
		l.Allow(e.ctx, "k")
	}
	if r, _ := l.Allow(e.ctx, "k"); r.Allowed {
		t.Fatal("101st call allowed")
	}
	if r, _ := l.AllowN(e.ctx, "k", 0); !r.Allowed || r.Remaining != 0 {
		t.Errorf("peek = %+v, want allowed with 0 remaining", r)
	}
	if err := l.Reset(e.ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if r, _ := l.AllowN(e.ctx, "k", 0); r.Remaining != 100 {
		t.Errorf("peek after Reset: remaining %d, want 100", r.Remaining)
	}
	if r, _ := l.AllowN(e.ctx, "k", 100); !r.Allowed {
		t.Errorf("after Reset: AllowN(100) = %+v, want allowed", r)
	}
}

func TestFallbackWhenRedisIsGone(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithFallback(tierlimit.PerSecond(3)))
	e.m.Close()
	// Until the breaker opens, a failed claim is denied: the fallback
	// mints no tokens for what may be a slow call (G1). Once it is open,
	// the fallback decides, from an empty bucket: the key was never
	// claimed, and other instances may have drained it.
	decide := func(calls int) []bool {
		var allowed []bool
		for i := 0; i < calls; i++ {
			r, err := l.Allow(e.ctx, "k")
			if err != nil {
				t.Fatalf("Allow with Redis down = %v, want no error", err)
			}
			if r.Source != tierlimit.SourceFallback {
				t.Errorf("call %d from %v, want fallback", i, r.Source)
			}
			if r.Allowed && l.Stats().BreakerOpens == 0 {
				t.Errorf("call %d allowed before the breaker opened, want denied", i)
			}
			allowed = append(allowed, r.Allowed)
		}
		return allowed
	}
	if got := decide(5); strings.Contains(fmt.Sprint(got), "true") {
		t.Errorf("calls with Redis down allowed %v at once, want none: no burst for a key never claimed", got)
	}
	// The fallback's rate flows: 3/s, up to its burst of 3.
	e.clock.Add(400 * time.Millisecond)
	if got := decide(3); fmt.Sprint(got) != "[true false false]" {
		t.Errorf("calls 400ms later allowed %v, want [true false false]: one token of 3/s", got)
	}
	e.clock.Add(5 * time.Second)
	if got := decide(5); strings.Count(fmt.Sprint(got), "true") != 3 {
		t.Errorf("calls 5s later allowed %v, want 3 allowed (the fallback's burst)", got)
	}
	e.clock.Add(5 * time.Second)
	if r, _ := l.AllowN(e.ctx, "k", 5); r.Allowed {
		t.Errorf("AllowN(5) over the fallback's burst of 3 = allowed, want denied")
	}
	if s := l.Stats(); s.RedisErrors == 0 || s.Fallback != 14 {
		t.Errorf("stats %+v, want Redis errors and 14 fallback decisions", s)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	ok := tierlimit.PerSecond(100)
	news := []struct {
		name  string
		rdb   redis.UniversalClient
		limit tierlimit.Limit
		opts  []Option
		want  error
	}{
		{"nil client", nil, ok, nil, tierlimit.ErrInvalidOption},
		{"zero limit", e.rdb, tierlimit.Limit{}, nil, tierlimit.ErrInvalidLimit},
		{"overflow", e.rdb, ok.WithBurst(1 << 62), nil, tierlimit.ErrInvalidLimit},
		{"nil option", e.rdb, ok, []Option{nil}, tierlimit.ErrInvalidOption},
		{"lease lo 0", e.rdb, ok, []Option{WithLeaseBounds(0, 5)}, tierlimit.ErrInvalidOption},
		{"lease hi < lo", e.rdb, ok, []Option{WithLeaseBounds(5, 4)}, tierlimit.ErrInvalidOption},
		{"lease over burst", e.rdb, ok, []Option{WithLeaseBounds(1, 101)}, tierlimit.ErrInvalidOption},
		{"ttl", e.rdb, ok, []Option{WithLeaseTTL(time.Millisecond)}, tierlimit.ErrInvalidOption},
		{"refill", e.rdb, ok, []Option{WithRefillInterval(0)}, tierlimit.ErrInvalidOption},
		{"budget", e.rdb, ok, []Option{WithCallBudget(time.Hour)}, tierlimit.ErrInvalidOption},
		{"max keys", e.rdb, ok, []Option{WithMaxKeys(0)}, tierlimit.ErrInvalidOption},
		{"prefix", e.rdb, ok, []Option{WithPrefix("{")}, tierlimit.ErrInvalidOption},
		{"clock", e.rdb, ok, []Option{WithClock(nil)}, tierlimit.ErrInvalidOption},
		{"fallback", e.rdb, ok, []Option{WithFallback(tierlimit.Limit{})}, tierlimit.ErrInvalidLimit},
	}
	for _, tt := range news {
		if l, err := New(tt.rdb, tt.limit, tt.opts...); !errors.Is(err, tt.want) || l != nil {
			t.Errorf("New(%s) = %v, %v; want nil, %v", tt.name, l, err, tt.want)
		}
	}
	// The input rules every tier shares are TestInputRules's, at the
	// module's root; a cancelled ctx is hybrid's own (local ignores ctx).
	l := e.limiter(t, ok)
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := l.AllowN(cancelled, "k", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("AllowN(cancelled) = %v, want %v", err, context.Canceled)
	}
}

func TestCloseTwiceAndNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newEnv(t)
	l, err := New(e.rdb, tierlimit.PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		l.Allow(e.ctx, fmt.Sprint("k", i%10))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if _, err := l.Allow(e.ctx, "k"); !errors.Is(err, tierlimit.ErrClosed) {
		t.Errorf("Allow after Close = %v, want ErrClosed", err)
	}
	e.rdb.Close()
	e.m.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after Close, %d before:\n%s", after, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestStatsCountEveryDecision checks the decision counters against what the
// callers saw, while leases expire, Reset forgets keys and (with a table
// smaller than the keys) ristretto drops entries and the janitor forgets
// them: the counts that local decisions keep in their entries are added up
// by Stats, and by an entry's retirement, and no decision is lost or
// counted twice, during the run and after Close.
func TestStatsCountEveryDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"cached", nil},
		{"dropped", []Option{WithMaxKeys(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) { statsCountEveryDecision(t, tc.opts...) })
	}
}

func statsCountEveryDecision(t *testing.T, opts ...Option) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.Limit{Rate: 10, Period: time.Second, Burst: 100}, append(opts, WithLeaseTTL(10*time.Millisecond))...)
	const workers, calls, keys = 8, 1500, 20
	var allowed, denied, local atomic.Int64
	var wg sync.WaitGroup
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // expire leases now and then (the janitor ticks every 2.5 ms), and reset a key
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				e.step(3 * time.Millisecond)
				if i%5 == 0 {
					// Reset waits at most its bound (G4): on a loaded machine,
					// behind 8 workers' claims, it may say Redis did not answer.
					if err := l.Reset(e.ctx, "k"+strconv.Itoa(i%keys)); err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
					}
				}
			}
		}
	}()
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				r, err := l.Allow(e.ctx, "k"+strconv.Itoa((w*calls+i)%keys))
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
				if r.Source == tierlimit.SourceLocal {
					local.Add(1)
				}
				if i%500 == 0 {
					if s := l.Stats(); s.Allowed+s.Denied > workers*calls {
						t.Errorf("mid-run Stats count %d decisions, more than %d made", s.Allowed+s.Denied, workers*calls)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-stopped // a Reset after Close would be ErrClosed
	for _, when := range []string{"before Close", "after Close"} {
		s := l.Stats()
		if s.Allowed != allowed.Load() || s.Denied != denied.Load() {
			t.Errorf("%s: Stats allowed %d, denied %d; callers saw %d, %d", when, s.Allowed, s.Denied, allowed.Load(), denied.Load())
		}
		if s.Local != local.Load() {
			t.Errorf("%s: Stats.Local = %d, callers saw %d", when, s.Local, local.Load())
		}
		if got := s.Local + s.Blocked + s.Remote + s.Fallback; got != workers*calls {
			t.Errorf("%s: decisions by source add up to %d, want %d", when, got, workers*calls)
		}
		if local.Load() == 0 || denied.Load() == 0 {
			t.Errorf("%s: %d local decisions and %d denials: the test no longer exercises both", when, local.Load(), denied.Load())
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHotPathAllocs checks that the decisions made in process allocate
// nothing: spending a lease, and denying a key Redis recently denied. (A
// spend that queues its lease's background refill allocates one channel,
// once per lease; the limit here is large enough that none is queued.)
func TestHotPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		limit  tierlimit.Limit
		opts   []Option
		source tierlimit.Source
	}{
		// Leases of 2^20 tokens: the runs below neither drain one nor bring
		// it down to half, where a background refill would be queued.
		{"lease", tierlimit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1 << 30},
			[]Option{WithLeaseBounds(1<<20, 1<<20)}, tierlimit.SourceLocal},
		{"known-blocked", tierlimit.PerHour(1), nil, tierlimit.SourceBlocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := e.limiter(t, tc.limit, tc.opts...)
			key := "hot:" + tc.name
			for range 20 { // demand that grows the lease, or denials
				if _, err := l.Allow(e.ctx, key); err != nil {
					t.Fatal(err)
				}
				e.step(100 * time.Microsecond)
			}
			if r, _ := l.Allow(e.ctx, key); r.Source != tc.source {
				t.Fatalf("warm call decided by %v, want %v", r.Source, tc.source)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if r, err := l.Allow(e.ctx, key); err != nil || r.Source != tc.source {
					t.Fatalf("Allow = %v from %v, %v; want a decision from %v", r.Allowed, r.Source, err, tc.source)
				}
			})
			if allocs != 0 {
				t.Errorf("%s path: %v allocations per decision, want 0", tc.name, allocs)
			}
		})
	}
}

// TestNewLoadsTheScript: New loads its bucket's script (the ledger's, with
// WithLimits too), so that the first claim runs it by its SHA.
func TestNewLoadsTheScript(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []Option
		script *redis.Script
	}{
		{"default", nil, script.Ledger},
		{"WithLimits", []Option{WithLimits(tierlimit.PerHour(1000))}, script.Ledger},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.limiter(t, tierlimit.PerSecond(10), tc.opts...)
			loaded, err := e.rdb.ScriptExists(e.ctx, tc.script.Hash()).Result()
			if err != nil {
				t.Fatal(err)
			}
			if !loaded[0] {
				t.Error("after New, SCRIPT EXISTS of the bucket's script = false, want true")
			}
		})
	}
}

// TestFallbackAllocs checks that a decision of the fallback bucket, while
// the breaker is open, allocates nothing once the key's bucket is made.
func TestFallbackAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithFallback(tierlimit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1 << 30}),
		WithProbeInterval(time.Minute))
	e.outage()
	for l.Stats().BreakerOpens == 0 {
		if _, err := l.Allow(e.ctx, "trip"); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := l.Allow(e.ctx, "k"); r.Source != tierlimit.SourceFallback {
		t.Fatalf("Allow decided by %v, want the fallback", r.Source)
	}
	e.clock.Add(time.Second) // the key's bucket, made empty, fills
	allocs := testing.AllocsPerRun(1000, func() {
		if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed || r.Source != tierlimit.SourceFallback {
			t.Fatalf("Allow = %+v, %v; want a fallback admission", r, err)
		}
	})
	if allocs != 0 {
		t.Errorf("fallback path: %v allocations per decision, want 0", allocs)
	}
}

// TestJanitorBlockedByAClaim: a claim in flight holds its key's lock for
// as long as Redis takes to answer (seconds in an outage), and the janitor
// cannot take the lease back meanwhile. The lease stops spending at the
// janitor's round all the same, so that none of its tokens is spent more
// than a quarter TTL past its TTL, where the ledger's record of it may
// have ended (leaseHold).
func TestJanitorBlockedByAClaim(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(1000), WithLeaseBounds(100, 100), WithLeaseTTL(time.Second),
		WithCallBudget(DefaultCallBudget))
	if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed {
		t.Fatalf("Allow(k) = %+v, %v; want allowed", r, err)
	}
	mu := l.keyLock("k")
	mu.Lock() // a claim of k's in flight, stalled
	e.step(1250 * time.Millisecond)
	if err := l.refundHeld(e.clock.Now(), false); err != nil {
		t.Fatal(err)
	}
	r, err := l.Allow(e.ctx, "k")
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if r.Source == tierlimit.SourceLocal {
		t.Errorf("Allow(k) after the janitor's round = %+v: spent from a lease past its TTL", r)
	}
	e.closeAndAuditAfter(t, l, l.Stats().Spent, nil, true)
}

// TestCloseWithNothingToGiveBack: on a stalled Redis, with go-redis's
// default client, a Close that has no token to give back returns nil,
// though it sends refunds for the claims whose replies never came (their
// records, in doubt, hold no token this instance has).
func TestCloseWithNothingToGiveBack(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	l, err := New(rdb, tierlimit.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if r, err := l.AllowN(ctx, "k", 1); err != nil || !r.Allowed { // exact mode: a lease of 1, spent
		t.Fatalf("AllowN(k, 1) = %+v, %v; want allowed", r, err)
	}
	s.Pause()
	defer s.Resume()
	// A claim that gets no reply (the client's read timeout, 3 s, ends
	// it): its record may hold a token, which Close refunds. The breaker
	// may be open already (the heartbeat failed first): its probes claim.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := l.AllowN(ctx, "k", 1); err != nil {
			t.Fatalf("AllowN(k, 1) on a stalled Redis = %v, want no error", err)
		}
		lost := false
		l.keys.each(func(e *entry) { lost = lost || e.lost.Load() })
		if lost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no claim on the stalled Redis failed within 15 s: %+v", l.Stats())
		}
	}
	if got := l.Stats().Held; got != 0 {
		t.Fatalf("Stats().Held = %d, want 0", got)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close() with nothing to give back = %v, want nil", err)
	}
}
