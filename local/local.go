// Package local provides an in-process keyed rate limiter: one token bucket
// per key, exact in integer arithmetic for every limit tierlimit.Limit
// accepts (golang.org/x/time/rate's bucket, without its float64 rounding),
// held in a ristretto cache bounded by a maximum number of keys.
//
// Memory is bounded by WithMaxKeys: when more keys arrive, ristretto's
// admission policy keeps the most frequently used ones and evicts (or
// refuses) the rest. An evicted key forgets its state: it starts again with a
// full bucket, so a key that keeps getting evicted may be admitted more than
// its limit. Size MaxKeys above the number of keys active within one Period.
//
// One Limiter serves keys of many limits: WithLimitFunc gives each key its
// own (a tenant's plan), and a key whose limit changes keeps its tokens.
// AllowAll decides several keys at once, all or nothing (a user and their
// org); WaitN waits its turn for a key; Settle corrects a charge after the
// fact (an estimate, then the real cost), into debt when the real cost
// overran what the key held; AllowAtMost takes up to n tokens, as many as
// a key holds (a batch consumer's messages).
//
// Time comes from the clock of WithClock (default: the system's monotonic
// clock). When an injected clock steps back, a bucket refills nothing until
// the clock passes the latest time it has seen, so an interval stepped over
// twice refills once. golang.org/x/time/rate differs: it moves its last
// update back with the clock and refills the stepped-over interval again.
//
// Decisions are per process: N processes each admit the whole limit. For a
// limit shared by a fleet, use the remote or hybrid packages.
package local

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/front"
	"github.com/tierlimit/tierlimit/internal/gate"
	"github.com/tierlimit/tierlimit/internal/wait"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// DefaultMaxKeys is the number of keys a Limiter holds unless WithMaxKeys
// says otherwise.
const DefaultMaxKeys = 100_000

// Clock tells the time; WithClock injects one (tests step it). It is
// tierlimit.Clock.
type Clock = tierlimit.Clock

// Option configures a Limiter.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	maxKeys   int64
	clock     Clock
	limitFunc tierlimit.LimitFunc
	lookup    tierlimit.LimitLookup
	open      bool // WithLookupFailOpen
	observer  *tierlimit.Observer
}

// WithObserver reports every decision (AllowN, AllowAll, AllowAtMost, and
// WaitN's tries)
// to o.Decision, with Latency 0 (a decision in process waits on nothing,
// and reading the clock to time it would cost more than deciding), and a whole charge given back (Settle with used 0) to
// o.GiveBack: a metrics bridge (package metrics, metrics/otelbridge) counts
// them. Its other funcs are never called (local makes no Redis call). The
// funcs run on the caller's goroutine, under no lock of the limiter.
func WithObserver(o *tierlimit.Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("local: %w: nil observer", tierlimit.ErrInvalidOption)
		}
		c.observer = o
		return nil
	})
}

// maxMaxKeys bounds WithMaxKeys: ristretto allocates its admission
// counters up front, about 48 bytes per key, whether or not the keys come.
const maxMaxKeys = 1 << 24

// WithMaxKeys bounds the number of keys held (default DefaultMaxKeys): from
// 1 to 2^24 (16,777,216). New allocates about 48 bytes per key of the bound
// up front (ristretto's admission counters), 768 MiB at the largest, and a
// front table of 64 bytes per key, at most 1 MiB.
func WithMaxKeys(n int64) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > maxMaxKeys {
			return fmt.Errorf("local: %w: max keys %d must be between 1 and %d", tierlimit.ErrInvalidOption, n, maxMaxKeys)
		}
		c.maxKeys = n
		return nil
	})
}

// WithClock sets the clock decisions are made on (default: time.Now).
func WithClock(clock Clock) Option {
	return optionFunc(func(c *config) error {
		if clock == nil {
			return fmt.Errorf("local: %w: nil clock", tierlimit.ErrInvalidOption)
		}
		c.clock = clock
		return nil
	})
}

// Limiter is an in-process keyed rate limiter. It is safe for concurrent use
// and must not be copied. Close releases its cache; after it, every method
// returns tierlimit.ErrClosed.
type Limiter struct {
	def    atomic.Pointer[tierlimit.Limit] // the default limit; SetLimit replaces it
	lookup check.Lookup                    // not Set: every key follows def
	clock  Clock
	cache  *ristretto.Cache[string, *entry] // the one registry of keys: it bounds them and keeps the most used
	hot    *front.Table[entry]              // recently found entries of cache (see find)
	gate   gate.Gate                        // the calls using cache, which Close waits for
	lines  wait.Lines                       // WaitN's waiters, which Close sends away

	// The observer's funcs (WithObserver), nil when not observed.
	onDecision func(tierlimit.Decision)
	onGiveBack func(tierlimit.GiveBack)

	// The system clock, read as the monotonic time since start, after
	// epoch (nanos): time.Now reads the wall clock too, and a time.Time
	// costs its building (BenchmarkCompare).
	mono  bool
	start time.Time
	epoch int64

	// stripes serialise the creation of a key's bucket, so that concurrent
	// first calls share one bucket.
	stripes [64]sync.Mutex
}

// New returns a Limiter enforcing limit for every key (the default limit,
// with WithLimitFunc). It returns an error wrapping
// tierlimit.ErrInvalidLimit or tierlimit.ErrInvalidOption.
func New(limit tierlimit.Limit, opts ...Option) (*Limiter, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	cfg := config{maxKeys: DefaultMaxKeys, clock: tierlimit.SystemClock{}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("local: %w: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, named(err)
		}
	}
	lookup, err := check.NewLookup(cfg.limitFunc, cfg.lookup, cfg.open)
	if err != nil {
		return nil, named(err)
	}
	cache, err := ristretto.NewCache(&ristretto.Config[string, *entry]{
		NumCounters:        cfg.maxKeys * 10,
		MaxCost:            cfg.maxKeys,
		BufferItems:        64,
		IgnoreInternalCost: true,
		OnExit:             gone, // evicted, refused or deleted
	})
	if err != nil {
		return nil, fmt.Errorf("local: %w: %v", tierlimit.ErrInvalidOption, err)
	}
	l := &Limiter{lookup: lookup, clock: cfg.clock, cache: cache, hot: front.New[entry](cfg.maxKeys), start: time.Now()}
	l.epoch = l.start.UnixNano()
	_, l.mono = cfg.clock.(tierlimit.SystemClock)
	if o := cfg.observer; o != nil {
		l.onDecision, l.onGiveBack = o.Decision, o.GiveBack
	}
	l.def.Store(&limit)
	return l, nil
}

// entry is a key's bucket in the cache. It is two cache lines, in Go's
// 128-byte size class: the first holds what a decision only reads (key,
// gone, the bucket's limit and scale), the second what it writes (the
// bucket's lock and level), so that the cores deciding one key in
// parallel take only the second from each other, and find the first in
// their own caches (TestEntryLayout; bench/RESULTS.md, issue 28).
type entry struct {
	key  string
	gone atomic.Bool // ristretto no longer holds e: find skips it
	b    xrate.Bucket
	_    [8]byte // to 120 bytes: in the 112-byte size class an entry would not start on a line
}

// gone is ristretto's callback for an entry leaving it (nil for a Del of
// a key it did not hold).
func gone(e *entry) {
	if e != nil {
		e.gone.Store(true)
	}
}

// nanos reads the clock, in ns (time.Time.UnixNano).
func (l *Limiter) nanos() int64 {
	if l.mono {
		return l.epoch + int64(time.Since(l.start))
	}
	return l.clock.Now().UnixNano()
}

func checkLimit(limit tierlimit.Limit) error {
	if err := limit.Validate(); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	return nil
}

// Limit returns the default limit: that of every key, or with
// WithLimitFunc, of the keys its function gives no limit of their own.
func (l *Limiter) Limit() tierlimit.Limit { return *l.def.Load() }

// SetLimit changes the default limit (Limit), for the keys already held
// too: each keeps the tokens it has (capped at the new burst) and refills
// at the new rate from its next call on. It returns an error wrapping
// tierlimit.ErrInvalidLimit for a bad limit, and then changes nothing, and
// tierlimit.ErrClosed after Close.
func (l *Limiter) SetLimit(limit tierlimit.Limit) error {
	if l.gate.Closed() {
		return tierlimit.ErrClosed
	}
	if err := checkLimit(limit); err != nil {
		return err
	}
	l.def.Store(&limit)
	return nil
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and takes them if
// so. n == 0 peeks. ctx is accepted for the tierlimit.Limiter interface and
// ignored: no call waits. Errors wrap tierlimit.ErrInvalidKey,
// tierlimit.ErrInvalidCost (n outside [0, the key's burst]) or, for a bad
// limit from WithLimitFunc's function, tierlimit.ErrInvalidLimit; after
// Close it returns tierlimit.ErrClosed. A key the function blocks
// (tierlimit.Blocked) is denied, n == 0 too, and not charged.
func (l *Limiter) AllowN(_ context.Context, key string, n int64) (tierlimit.Result, error) {
	var res tierlimit.Result
	if err := l.allowN(&res, key, n); err != nil {
		return tierlimit.Result{}, named(err)
	}
	if l.onDecision != nil {
		l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Limit: res.Limit})
	}
	return res, nil
}

// named returns err as local's callers see it (check.Named).
func named(err error) error { return check.Named("local", err) }

// allowN is AllowN writing its Result into res, which AllowN returns: the
// Result is written once, by the bucket's decision, not copied up through
// each call (see xrate's decide). On an error res means nothing: AllowN
// returns the zero Result.
func (l *Limiter) allowN(res *tierlimit.Result, key string, n int64) error {
	if err := check.Key(key); err != nil {
		return err
	}
	if l.gate.Closed() {
		return tierlimit.ErrClosed
	}
	limit, err := l.limitOf(key)
	if err != nil {
		return err
	}
	if limit.IsBlocked() {
		if err := checkBlockedCost(key, n); err != nil {
			return err
		}
		*res = blocked
		return nil
	}
	now := l.nanos()
	b, err := l.bucket(key, front.Hash(key), limit, now)
	if err != nil {
		return err
	}
	if err := b.DecideLimitNano(res, now, limit, n); err != nil {
		return keyError(key, err)
	}
	return nil
}

// AllowAtMost takes between 1 and n tokens for key, as many as it holds
// whole (a batch consumer takes up to n messages), and returns how many,
// with the Result: Allowed, Remaining what is left. When the key holds
// less than one whole token (a part of one, or debt from Settle) it takes
// none and returns 0 and a denial whose RetryAfter is the exact wait for
// one whole token. n may exceed the key's burst. ctx is accepted and
// ignored. A key WithLimitFunc's function blocks (tierlimit.Blocked) is
// granted 0 with the blocked Result. WithObserver's Decision reports N =
// granted, or n when denied.
//
// Errors wrap tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost (n outside
// [1, tierlimit.MaxRate]) or tierlimit.ErrInvalidLimit (a bad limit from
// WithLimitFunc's function), and take nothing; after Close it returns
// tierlimit.ErrClosed.
func (l *Limiter) AllowAtMost(_ context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	granted, res, err := l.allowAtMost(key, n)
	if err != nil {
		return 0, res, named(err)
	}
	if l.onDecision != nil {
		d := tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Limit: res.Limit}
		if res.Allowed {
			d.N = granted
		}
		l.onDecision(d)
	}
	return granted, res, nil
}

func (l *Limiter) allowAtMost(key string, n int64) (int64, tierlimit.Result, error) {
	if err := check.Key(key); err != nil {
		return 0, tierlimit.Result{}, err
	}
	if err := check.AtMost(n); err != nil {
		return 0, tierlimit.Result{}, keyError(key, err)
	}
	if l.gate.Closed() {
		return 0, tierlimit.Result{}, tierlimit.ErrClosed
	}
	limit, err := l.limitOf(key)
	if err != nil {
		return 0, tierlimit.Result{}, err
	}
	if limit.IsBlocked() {
		return 0, blocked, nil
	}
	now := l.nanos()
	b, err := l.bucket(key, front.Hash(key), limit, now)
	if err != nil {
		return 0, tierlimit.Result{}, err
	}
	granted, res, err := b.DecideAtMost(time.Unix(0, now), limit, n)
	if err != nil {
		return 0, tierlimit.Result{}, keyError(key, err)
	}
	return granted, res, nil
}

// Reset forgets key: its next call starts with a full bucket. It returns
// tierlimit.ErrClosed after Close.
func (l *Limiter) Reset(_ context.Context, key string) error {
	if err := check.Key(key); err != nil {
		return named(err)
	}
	h := front.Hash(key)
	if !l.gate.Enter(h) {
		return tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	if e, ok := l.cache.Get(key); ok {
		e.gone.Store(true) // before Del: a call that found e in the front table stops using it
	}
	l.cache.Del(key)
	l.cache.Wait()
	return nil
}

// Close sends WaitN's waiters away, waits for the calls in flight, then
// releases the cache and its goroutines. It is safe to call twice, and
// concurrently with any method.
func (l *Limiter) Close() error {
	l.lines.Close()
	if l.gate.Close() {
		l.cache.Close()
	}
	return nil
}

// bucket returns key's bucket, made full under limit if key has none. It
// returns an error wrapping tierlimit.ErrInvalidLimit when it would make
// one of an invalid limit, and tierlimit.ErrClosed after Close.
func (l *Limiter) bucket(key string, h uint64, limit tierlimit.Limit, now int64) (*xrate.Bucket, error) {
	set, tag := l.hot.Set(h)
	for i := range front.Ways {
		if e := set.Load(i, tag); e != nil && e.key == key && !e.gone.Load() {
			if front.Sampled() {
				l.touch(key, h)
			}
			return &e.b, nil
		}
	}
	if !l.gate.Enter(h) {
		return nil, tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	e, err := l.entry(key, h, limit, now)
	if err != nil {
		return nil, err
	}
	if !e.gone.Load() {
		set.Store(tag, e)
	}
	return &e.b, nil
}

// touch reports a use of key, which the front table answered, to
// ristretto's admission policy: a Get counts it.
func (l *Limiter) touch(key string, h uint64) {
	if l.gate.Enter(h) {
		l.cache.Get(key)
		l.gate.Exit(h)
	}
}

// entry returns key's entry in the cache, or a new one, full under limit,
// that the cache is asked to hold. The caller is inside the gate.
func (l *Limiter) entry(key string, h uint64, limit tierlimit.Limit, now int64) (*entry, error) {
	if e, ok := l.cache.Get(key); ok && !e.gone.Load() {
		return e, nil
	}
	if err := limit.Validate(); err != nil {
		return nil, keyError(key, err)
	}
	mu := &l.stripes[h%uint64(len(l.stripes))]
	mu.Lock()
	defer mu.Unlock()
	if e, ok := l.cache.Get(key); ok && !e.gone.Load() {
		return e, nil
	}
	e := &entry{key: key}
	e.b.Init(limit, time.Unix(0, now))
	// Set may be refused by the admission policy: the bucket then serves
	// this call only, as if evicted at once (OnExit marks it gone).
	if l.cache.Set(key, e, 1) {
		l.cache.Wait()
	}
	return e, nil
}
