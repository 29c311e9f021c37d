package hybrid

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TestTwoLimitsOnOnePrefix: two live limiters of this process with other
// limits under one prefix on one server would share buckets: New refuses
// the second (ErrMisconfigured), whether the two share a client or not. The
// same limit shares on purpose, with an extra limit too (whose buckets are
// its own); another prefix, another server, or the first limiter closed,
// is fine.
func TestTwoLimitsOnOnePrefix(t *testing.T) {
	e := newEnv(t)
	requests := e.limiter(t, tierlimit.PerSecond(100).WithBurst(200))
	other := redis.NewClient(&redis.Options{Addr: e.m.Addr()}) // the same server, another client
	defer other.Close()
	for _, c := range []struct {
		name string
		rdb  redis.UniversalClient
		opts []Option
		want error
	}{
		{"another limit, the same client", e.rdb, nil, tierlimit.ErrMisconfigured},
		{"another limit, another client of the server", other, nil, tierlimit.ErrMisconfigured},
		{"another limit, another prefix", e.rdb, []Option{WithPrefix("tokens:")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(c.rdb, tierlimit.PerSecond(5000).WithBurst(20_000), append(c.opts, WithClock(e.clock))...)
			if l != nil {
				defer l.Close()
			}
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("New = %v, want %v", err, c.want)
			}
		})
	}
	same, err := New(other, tierlimit.PerSecond(100).WithBurst(200), WithClock(e.clock))
	if err != nil {
		t.Errorf("New with the same limit on the same prefix = %v, want nil (a bucket shared on purpose)", err)
	} else {
		same.Close()
	}
	extra, err := New(e.rdb, tierlimit.PerSecond(100).WithBurst(200), WithLimits(tierlimit.PerHour(1000)), WithClock(e.clock))
	if err != nil {
		t.Errorf("New with the same limit and an extra one = %v, want nil (the first limit's bucket shared on purpose, the extra's its own)", err)
	}
	if extra != nil {
		extra.Close()
	}
	requests.Close()
	tokens, err := New(e.rdb, tierlimit.PerSecond(5000).WithBurst(20_000), WithClock(e.clock))
	if err != nil {
		t.Errorf("New after the first limiter closed = %v, want nil", err)
	} else {
		tokens.Close()
	}
}

// TestAnswersShared: the limiters of a process on one server, through any
// client, share when it last answered (heard): a call that runs long while
// the server answers another limiter's calls is slow, not an outage. A
// limiter on another server has its own.
func TestAnswersShared(t *testing.T) {
	e := newEnv(t)
	a := e.limiter(t, tierlimit.PerSecond(100))
	other := redis.NewClient(&redis.Options{Addr: e.m.Addr()})
	defer other.Close()
	b, err := New(other, tierlimit.PerSecond(100))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := newEnv(t).limiter(t, tierlimit.PerSecond(100))
	if a.answered != b.answered {
		t.Error("two limiters on one server keep two clocks of its answers, want one")
	}
	if a.answered == c.answered {
		t.Error("limiters on two servers share a clock of their answers, want one each")
	}
	if _, err := a.Allow(e.ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if got := b.lastAnswer(time.Time{}); got.IsZero() || time.Since(got) > time.Second {
		t.Errorf("b's last answer after a's call = %v, want within a second", got)
	}
}
