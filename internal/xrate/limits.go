package xrate

import (
	"fmt"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// DecideLimit is Decide for a bucket whose limit may change between calls
// (a tenant's plan): when limit differs from the one b follows, b first
// follows it (SetLimit at now). It returns an error wrapping
// tierlimit.ErrInvalidLimit for an invalid new limit, and
// tierlimit.ErrInvalidCost when n is outside [0, the limit's capacity];
// b is then unchanged.
func (b *Bucket) DecideLimit(now time.Time, limit tierlimit.Limit, n int64) (tierlimit.Result, error) {
	var res tierlimit.Result
	err := b.DecideLimitNano(&res, now.UnixNano(), limit, n)
	return res, err
}

// DecideLimitNano is DecideLimit at now in ns (time.Time.UnixNano), writing
// the Result into res (the zero Result with an error): a caller that reads
// a monotonic clock in ns saves building a time.Time, and one that returns
// the Result saves copying it (see decide).
func (b *Bucket) DecideLimitNano(res *tierlimit.Result, now int64, limit tierlimit.Limit, n int64) error {
	b.mu.Lock()
	if limit != b.limit || n < 0 || uint64(n) > b.cap {
		return b.decideOther(res, now, limit, n)
	}
	// The limit b follows, a cost it can hold: Decide's path, without a
	// defer (local's every decision: BenchmarkHotKeyPaired in local).
	b.advance(now)
	b.decide(res, now, n)
	b.mu.Unlock()
	return nil
}

// decideOther is DecideLimitNano for a new limit or a bad cost. b.mu is
// held; decideOther unlocks it.
func (b *Bucket) decideOther(res *tierlimit.Result, now int64, limit tierlimit.Limit, n int64) error {
	defer b.mu.Unlock()
	if err := b.check(limit, n); err != nil {
		*res = tierlimit.Result{}
		return err
	}
	b.follow(now, limit)
	b.decide(res, now, n)
	return nil
}

// check reports whether b may follow limit and take n under it. Validate
// runs only for a limit b does not follow already: b's own is valid.
// b.mu must be held.
func (b *Bucket) check(limit tierlimit.Limit, n int64) error {
	if limit != b.limit {
		if err := limit.Validate(); err != nil {
			return err
		}
	}
	return limit.CheckCost(n)
}

// Settle corrects a charge made earlier: the caller took charged tokens
// and really used used. charged > used gives the difference back (b is
// capped at its capacity); used > charged takes the difference more, into
// debt below empty if b lacks it, down to minus the capacity at the most
// (the events happened: it is never refused, and the tokens they used are
// not forgiven). A Bucket in debt denies every cost, peeks included, until
// its refill has repaid the debt: RetryAfter and ResetAfter count it, and
// Remaining is 0. What the floor cuts off is the Result's Uncharged: used
// may be any count from 0, above the capacity too. b follows limit first,
// as in DecideLimit. It returns the Result after the correction, Allowed,
// or an error wrapping tierlimit.ErrInvalidLimit, or
// tierlimit.ErrInvalidCost when charged is outside [0, the limit's
// capacity] or used is negative; b is then unchanged.
func (b *Bucket) Settle(t time.Time, limit tierlimit.Limit, charged, used int64) (tierlimit.Result, error) {
	now := t.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(limit, charged); err != nil {
		return tierlimit.Result{}, err
	}
	if used < 0 {
		return tierlimit.Result{}, fmt.Errorf("%w: used %d must be >= 0", tierlimit.ErrInvalidCost, used)
	}
	b.follow(now, limit)
	// d is at least -cap (charged <= cap, used >= 0), and room, what the
	// whole tokens may fall before the floor, within [0, 2·cap]: no
	// overflow. Past room the level is the floor, its part-token gone.
	w, d := b.whole(), used-charged
	res := tierlimit.Result{Allowed: true, Source: tierlimit.SourceLocal}
	if room := w + int64(b.cap); d > room {
		res.Uncharged, d = d-room, room+1
	}
	b.setWhole(w - d)
	res.Limit = b.limit
	b.result(&res, now)
	return res, nil
}

// DecideAtMost takes between 1 and n tokens at now, as many as b holds
// whole, and returns how many with the Result: Allowed, RetryAfter 0 and
// Remaining what is left. When b holds less than one whole token (a part of
// one, or debt), it takes none and returns 0 with a denial whose
// RetryAfter is the exact wait for one whole token. n may exceed the
// capacity (up to tierlimit.MaxRate). b follows limit first, as in
// DecideLimit. It returns an error wrapping tierlimit.ErrInvalidLimit, or
// tierlimit.ErrInvalidCost for n outside [1, tierlimit.MaxRate]; b is
// then unchanged.
func (b *Bucket) DecideAtMost(t time.Time, limit tierlimit.Limit, n int64) (int64, tierlimit.Result, error) {
	now := t.UnixNano()
	if err := check.AtMost(n); err != nil {
		return 0, tierlimit.Result{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(limit, 0); err != nil {
		return 0, tierlimit.Result{}, err
	}
	b.follow(now, limit)
	res := tierlimit.Result{Limit: b.limit, Source: tierlimit.SourceLocal}
	if b.owed > 0 || b.tokens == 0 {
		res.RetryAfter = b.wait(now, 1)
		b.result(&res, now)
		return 0, res, nil
	}
	g := min(uint64(n), b.tokens)
	b.tokens -= g
	res.Allowed = true
	b.result(&res, now)
	return int64(g), res, nil
}

// Take is one bucket's part of DecideAll: N tokens from Bucket, which
// follows Limit from then on.
type Take struct {
	Bucket *Bucket
	Limit  tierlimit.Limit
	N      int64
}

// DecideAll takes every take's N tokens at now, or none: only if every
// bucket holds its take. Each bucket first follows its take's Limit, as in
// DecideLimit. The Result is the most restrictive take's: on a denial,
// that of the largest RetryAfter; on an admission, that of the smallest
// Remaining (the first of equals).
//
// The buckets must be distinct. DecideAll locks them in the order of
// takes: callers whose takes may share buckets must order them alike (by
// key, say), or two calls could each hold a bucket the other waits for.
// It returns an error wrapping tierlimit.ErrInvalidLimit or
// tierlimit.ErrInvalidCost, as DecideLimit does, before it changes any
// bucket.
func DecideAll(t time.Time, takes []Take) (tierlimit.Result, error) {
	now := t.UnixNano()
	switch len(takes) {
	case 0:
		return tierlimit.Result{}, fmt.Errorf("%w: no takes", tierlimit.ErrInvalidCost)
	case 1:
		// One bucket's decision, without the loops below (hybrid's every
		// decision in an outage: BenchmarkAllowOutage).
		var res tierlimit.Result
		err := takes[0].Bucket.DecideLimitNano(&res, now, takes[0].Limit, takes[0].N)
		return res, err
	}
	for _, t := range takes {
		if err := t.Limit.Validate(); err != nil {
			return tierlimit.Result{}, err
		}
		if err := t.Limit.CheckCost(t.N); err != nil {
			return tierlimit.Result{}, err
		}
	}
	for _, t := range takes {
		t.Bucket.mu.Lock()
	}
	defer func() {
		for _, t := range takes {
			t.Bucket.mu.Unlock()
		}
	}()
	worst, allowed := 0, true
	for i, t := range takes {
		t.Bucket.follow(now, t.Limit)
		if !t.Bucket.has(t.N) {
			if allowed || t.Bucket.wait(now, uint64(t.N)) > takes[worst].Bucket.wait(now, uint64(takes[worst].N)) {
				worst = i
			}
			allowed = false
		}
	}
	if !allowed {
		w := takes[worst]
		var res tierlimit.Result
		w.Bucket.decide(&res, now, w.N)
		return res, nil
	}
	for i, t := range takes {
		t.Bucket.tokens -= uint64(t.N)
		if t.Bucket.tokens < takes[worst].Bucket.tokens {
			worst = i
		}
	}
	w := takes[worst].Bucket
	res := tierlimit.Result{Allowed: true, Limit: w.limit, Source: tierlimit.SourceLocal}
	w.result(&res, now)
	return res, nil
}
