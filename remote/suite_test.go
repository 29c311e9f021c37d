package remote

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// decider is what every limiter of this package offers.
type decider interface {
	Allow(ctx context.Context, key string) (tierlimit.Result, error)
	AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Reset(ctx context.Context, key string) error
}

type constructor func(rdb redis.UniversalClient, l tierlimit.Limit, opts ...Option) (decider, error)

func ctor[T decider](f func(redis.UniversalClient, tierlimit.Limit, ...Option) (T, error)) constructor {
	return func(rdb redis.UniversalClient, l tierlimit.Limit, opts ...Option) (decider, error) {
		d, err := f(rdb, l, opts...)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return d, nil
	}
}

// algorithms lists every limiter of the package, for suites that run over all.
var algorithms = []struct {
	name string
	new  constructor
	// windowed algorithms count Rate per Period and take no burst.
	windowed bool
}{
	{"TokenBucket", ctor(NewTokenBucket), false},
	{"GCRA", ctor(NewGCRA), false},
	{"FixedWindow", ctor(NewFixedWindow), true},
	{"AnchoredWindow", ctor(NewAnchoredWindow), true},
	{"SlidingLog", ctor(NewSlidingLog), true},
	{"SlidingWindow", ctor(NewSlidingWindow), true},
}

// backend is a Redis the suite runs on, with a way to set the time the
// scripts see.
type backend struct {
	rdb  redis.UniversalClient
	opts []Option        // options every limiter of the suite gets
	set  func(time.Time) // sets the scripts' clock
}

// t0 is aligned on 10 s so that the windows of the suite's limits start there.
var t0 = time.Unix(1_700_000_000, 0)

func miniBackend(t *testing.T) backend {
	m, rdb := redistest.Mini(t)
	// The scripts read miniredis's settable server clock through TIME.
	return backend{rdb: rdb, set: m.SetTime}
}

func clientClockBackend(rdb redis.UniversalClient) backend {
	c := &clocktest.Clock{}
	return backend{rdb: rdb, opts: []Option{WithClientClock(c)}, set: c.Set}
}

func TestSuiteMiniredis(t *testing.T) { runSuite(t, miniBackend(t)) }

func TestSuiteRedis(t *testing.T) { checkOn(t, redistest.Start(t).Client(t), runSuite) }

func TestSuiteCluster(t *testing.T) { checkOn(t, redistest.StartCluster(t).Client(t), runSuite) }

// checkOn runs run on rdb, a real Redis or Cluster, with a client clock
// the run sets, then checks that every key left has a TTL.
func checkOn(t *testing.T, rdb redis.UniversalClient, run func(*testing.T, backend)) {
	b := clientClockBackend(rdb)
	run(t, b)
	redistest.CheckTTLs(t, b.rdb)
}

// suiteKeys are user keys the suite runs with: plain, and ones that would
// move or split a Cluster slot if the library did not own the hash tag.
var suiteKeys = []string{"user:42", "a{b}c", "}{", "{x}", "\xff\xfe\x00:{\x80}"}

func runSuite(t *testing.T, b backend) {
	for _, alg := range algorithms {
		for i, key := range suiteKeys {
			t.Run(fmt.Sprintf("%s/key%d", alg.name, i), func(t *testing.T) {
				prefix := WithPrefix(fmt.Sprintf("suite%d:", i))
				opts := append([]Option{prefix}, b.opts...)
				s := &suite{t: t, b: b, key: key, opts: opts, new: alg.new}
				s.sequence()
				s.retryAfterIsHonest()
				s.peekDoesNotCharge()
				s.reset()
				s.multiLimit()
			})
		}
	}
}

type suite struct {
	t    *testing.T
	b    backend
	key  string
	opts []Option
	new  constructor
}

func (s *suite) limiter(l tierlimit.Limit, opts ...Option) decider {
	s.t.Helper()
	d, err := s.new(s.b.rdb, l, append(append([]Option{}, s.opts...), opts...)...)
	if err != nil {
		s.t.Fatalf("new(%v) = %v", l, err)
	}
	if err := d.Reset(context.Background(), s.key); err != nil {
		s.t.Fatalf("Reset = %v", err)
	}
	return d
}

func (s *suite) allowN(d decider, at time.Time, n int64) tierlimit.Result {
	s.t.Helper()
	s.b.set(at)
	r, err := d.AllowN(context.Background(), s.key, n)
	if err != nil {
		s.t.Fatalf("AllowN(%v, %d) = %v", at.Sub(t0), n, err)
	}
	return r
}

func (s *suite) want(d decider, at time.Time, n int64, allowed bool, remaining int64) tierlimit.Result {
	s.t.Helper()
	r := s.allowN(d, at, n)
	if r.Allowed != allowed || r.Remaining != remaining {
		s.t.Errorf("AllowN(t0+%v, %d) = allowed %v remaining %d, want %v %d (%+v)",
			at.Sub(t0), n, r.Allowed, r.Remaining, allowed, remaining, r)
	}
	if r.Source != tierlimit.SourceRemote {
		s.t.Errorf("Source = %v, want remote", r.Source)
	}
	if r.Allowed && r.RetryAfter != 0 {
		s.t.Errorf("allowed with RetryAfter %v, want 0", r.RetryAfter)
	}
	return r
}

// sequence: three allowed at one instant, then denied.
func (s *suite) sequence() {
	d := s.limiter(tierlimit.PerSecond(3))
	at := t0.Add(100 * time.Millisecond)
	s.want(d, at, 1, true, 2)
	s.want(d, at, 1, true, 1)
	s.want(d, at, 1, true, 0)
	r := s.want(d, at, 1, false, 0)
	// A sliding window may have to wait into the next window.
	if r.RetryAfter <= 0 || r.RetryAfter > 2*time.Second {
		s.t.Errorf("denied RetryAfter = %v, want in (0, 2s]", r.RetryAfter)
	}
	if r.ResetAfter <= 0 || r.ResetAfter > 2*time.Second {
		s.t.Errorf("ResetAfter = %v, want in (0, 2s]", r.ResetAfter)
	}
}

// retryAfterIsHonest: after waiting RetryAfter the same request succeeds; a
// microsecond earlier it does not. Checked for several costs and instants.
func (s *suite) retryAfterIsHonest() {
	for _, n := range []int64{1, 2, 4} {
		d := s.limiter(tierlimit.PerSecond(4))
		at := t0.Add(250 * time.Millisecond)
		s.allowN(d, at, 3)
		at = at.Add(10 * time.Millisecond)
		r := s.allowN(d, at, n)
		for i := 0; i < 3 && !r.Allowed; i++ {
			retry := at.Add(r.RetryAfter)
			if early := s.allowN(d, retry.Add(-time.Microsecond), n); early.Allowed {
				s.t.Fatalf("n=%d: allowed %v before RetryAfter %v", n, time.Microsecond, r.RetryAfter)
			}
			r = s.allowN(d, retry, n)
			if !r.Allowed {
				s.t.Fatalf("n=%d: denied after waiting RetryAfter: %+v", n, r)
			}
			// Exhaust again and check the next RetryAfter too.
			at = retry
			s.allowN(d, at, r.Remaining)
			r = s.allowN(d, at, n)
		}
	}
}

// peekDoesNotCharge: n == 0 is allowed, changes nothing.
func (s *suite) peekDoesNotCharge() {
	d := s.limiter(tierlimit.PerSecond(3))
	at := t0.Add(time.Second)
	for i := 0; i < 5; i++ {
		s.want(d, at, 0, true, 3)
	}
	s.want(d, at, 2, true, 1)
	s.want(d, at, 0, true, 1)
	s.want(d, at, 2, false, 1) // denied: charges nothing
	s.want(d, at, 0, true, 1)
	s.want(d, at, 1, true, 0)
}

// reset restores full capacity.
func (s *suite) reset() {
	d := s.limiter(tierlimit.PerSecond(3))
	at := t0.Add(2 * time.Second)
	s.want(d, at, 3, true, 0)
	s.want(d, at, 1, false, 0)
	if err := d.Reset(context.Background(), s.key); err != nil {
		s.t.Fatalf("Reset = %v", err)
	}
	s.want(d, at, 0, true, 3)
	s.want(d, at, 3, true, 0)
}

// multiLimit: two limits at once, all or nothing: a denial by either limit
// charges neither. A single-limit limiter of the first limit, with the same
// prefix, reads the same keys (its position, 0), so it shows that limit's
// state; the second's shows in what the pair admits later.
func (s *suite) multiLimit() {
	a := tierlimit.PerSecond(2)
	b := tierlimit.Limit{Rate: 3, Period: 10 * time.Second}
	both := s.limiter(a, WithLimits(b))
	onlyA := s.limiter(a)
	at := t0.Add(3 * time.Second)
	s.want(both, at, 2, true, 0)  // a: 0 left, b: 1 left
	s.want(both, at, 1, false, 0) // denied by a: b keeps 1
	at = at.Add(2 * time.Second)  // a refills (a sliding window needs two periods), b does not
	s.want(onlyA, at, 0, true, 2)
	s.want(both, at, 0, true, 1)  // b has 1: the denial charged it nothing
	s.want(both, at, 2, false, 1) // denied by b
	s.want(onlyA, at, 0, true, 2) // a not charged
	s.want(both, at, 1, true, 0)
	s.want(onlyA, at, 0, true, 1)
	r := s.allowN(both, at, 1)
	if r.Allowed || r.Limit != b {
		s.t.Errorf("denied by %v, want by %v", r.Limit, b)
	}
}
