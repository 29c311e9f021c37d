package remote

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TestBadInput checks every bad input of every limiter against its error.
// Validation happens before any network call, so the client points nowhere.
func TestBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	ok := tierlimit.PerSecond(10)
	constructs := []struct {
		name  string
		rdb   redis.UniversalClient
		limit tierlimit.Limit
		opts  []Option
		want  error
	}{
		{"nil client", nil, ok, nil, tierlimit.ErrInvalidOption},
		{"typed nil *redis.Client", (*redis.Client)(nil), ok, nil, tierlimit.ErrInvalidOption},
		{"typed nil *redis.ClusterClient", (*redis.ClusterClient)(nil), ok, nil, tierlimit.ErrInvalidOption},
		{"typed nil *redis.Ring", (*redis.Ring)(nil), ok, nil, tierlimit.ErrInvalidOption},
		{"zero limit", rdb, tierlimit.Limit{}, nil, tierlimit.ErrInvalidLimit},
		{"negative rate", rdb, tierlimit.Limit{Rate: -5, Period: time.Second}, nil, tierlimit.ErrInvalidLimit},
		{"zero period", rdb, tierlimit.Limit{Rate: 5}, nil, tierlimit.ErrInvalidLimit},
		{"negative burst", rdb, ok.WithBurst(-1), nil, tierlimit.ErrInvalidLimit},
		{"nanosecond period", rdb, tierlimit.Limit{Rate: 1, Period: time.Nanosecond}, nil, tierlimit.ErrInvalidLimit},
		{"above max rate", rdb, tierlimit.PerSecond(tierlimit.MaxRate + 1), nil, tierlimit.ErrInvalidLimit},
		{"overflowing rate", rdb, tierlimit.Limit{Rate: math.MaxInt64, Period: time.Second}, nil, tierlimit.ErrInvalidLimit},
		{"overflowing period", rdb, tierlimit.Limit{Rate: 1, Period: math.MaxInt64}, nil, tierlimit.ErrInvalidLimit},
		{"overflowing burst", rdb, ok.WithBurst(math.MaxInt64), nil, tierlimit.ErrInvalidLimit},
		{"bad extra limit", rdb, ok, []Option{WithLimits(tierlimit.Limit{Rate: 1})}, tierlimit.ErrInvalidLimit},
		{"brace in prefix", rdb, ok, []Option{WithPrefix("a{b}")}, tierlimit.ErrInvalidOption},
		{"long prefix", rdb, ok, []Option{WithPrefix(strings.Repeat("p", 65))}, tierlimit.ErrInvalidOption},
		{"nil clock", rdb, ok, []Option{WithClientClock(nil)}, tierlimit.ErrInvalidOption},
		{"nil option", rdb, ok, []Option{nil}, tierlimit.ErrInvalidOption},
	}
	for _, alg := range algorithms {
		for _, tt := range constructs {
			d, err := alg.new(tt.rdb, tt.limit, tt.opts...)
			if !errors.Is(err, tt.want) || d != nil {
				t.Errorf("%s: New(%s) = %v, %v; want nil, %v", alg.name, tt.name, d, err, tt.want)
			}
		}
		if alg.windowed {
			if _, err := alg.new(rdb, ok.WithBurst(20)); !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Errorf("%s: burst on a window = %v, want ErrInvalidLimit", alg.name, err)
			}
		}

		d, err := alg.new(rdb, ok, WithLimits(tierlimit.PerMinute(100).WithBurst(8)))
		if alg.windowed {
			d, err = alg.new(rdb, ok, WithLimits(tierlimit.Limit{Rate: 8, Period: time.Minute}))
		}
		if err != nil {
			t.Fatalf("%s: New = %v", alg.name, err)
		}
		ctx := context.Background()
		calls := []struct {
			name string
			key  string
			n    int64
			want error
		}{
			{"empty key", "", 1, tierlimit.ErrInvalidKey},
			{"long key", strings.Repeat("k", tierlimit.MaxKeyLen+1), 1, tierlimit.ErrInvalidKey},
			{"negative cost", "k", -1, tierlimit.ErrInvalidCost},
			{"cost over the smallest burst", "k", 9, tierlimit.ErrInvalidCost},
			{"max cost", "k", math.MaxInt64, tierlimit.ErrInvalidCost},
			{"min cost", "k", math.MinInt64, tierlimit.ErrInvalidCost},
		}
		for _, c := range calls {
			if _, err := d.AllowN(ctx, c.key, c.n); !errors.Is(err, c.want) {
				t.Errorf("%s: AllowN(%s) = %v, want %v", alg.name, c.name, err, c.want)
			}
		}
		if err := d.Reset(ctx, ""); !errors.Is(err, tierlimit.ErrInvalidKey) {
			t.Errorf("%s: Reset(\"\") = %v, want ErrInvalidKey", alg.name, err)
		}
	}

}

// TestTenantBadInput checks the new calls' input errors: bad LimitFunc
// answers, bad takes, bad settle costs; all before any call (the client
// points nowhere).
func TestTenantBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	ctx := context.Background()
	answers := map[string]tierlimit.Limit{
		"neg":      {Rate: -1, Period: time.Second},
		"noperiod": {Rate: 5},
		"huge":     tierlimit.PerSecond(math.MaxInt64),
		"burst":    tierlimit.PerSecond(10).WithBurst(20), // windows take no burst
	}
	f := func(k string) tierlimit.Limit { return answers[k] }
	for _, alg := range algorithms {
		l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(10), WithLimitFunc(f))
		for key := range answers {
			if key == "burst" && !alg.windowed {
				continue
			}
			if _, err := l.AllowN(ctx, key, 1); !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Errorf("%s: AllowN(%q) = %v, want ErrInvalidLimit", alg.name, key, err)
			}
			if _, err := l.AllowAll(ctx, tierlimit.Take{Key: "ok", N: 1}, tierlimit.Take{Key: key, N: 1}); !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Errorf("%s: AllowAll(%q) = %v, want ErrInvalidLimit", alg.name, key, err)
			}
			if _, err := l.Settle(ctx, key, 1, 0); !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Errorf("%s: Settle(%q) = %v, want ErrInvalidLimit", alg.name, key, err)
			}
			if _, err := l.WaitN(ctx, key, 1); !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Errorf("%s: WaitN(%q) = %v, want ErrInvalidLimit", alg.name, key, err)
			}
		}
		takes := []struct {
			name  string
			takes []tierlimit.Take
			want  error
		}{
			{"none", nil, tierlimit.ErrInvalidCost},
			{"empty key", []tierlimit.Take{{Key: "", N: 1}}, tierlimit.ErrInvalidKey},
			{"negative", []tierlimit.Take{{Key: "a", N: -1}}, tierlimit.ErrInvalidCost},
			{"above capacity", []tierlimit.Take{{Key: "a", N: 11}}, tierlimit.ErrInvalidCost},
			{"above capacity once merged", []tierlimit.Take{{Key: "a", N: 6}, {Key: "a", N: 5}}, tierlimit.ErrInvalidCost},
			{"overflow", []tierlimit.Take{{Key: "a", N: math.MaxInt64}, {Key: "a", N: 1}}, tierlimit.ErrInvalidCost},
			{"too many", manyTakes(tierlimit.MaxTakes + 1), tierlimit.ErrInvalidCost},
		}
		for _, tt := range takes {
			if _, err := l.AllowAll(ctx, tt.takes...); !errors.Is(err, tt.want) {
				t.Errorf("%s: AllowAll(%s) = %v, want %v", alg.name, tt.name, err, tt.want)
			}
		}
		settles := []struct {
			key           string
			charged, used int64
			want          error
		}{
			{"", 1, 0, tierlimit.ErrInvalidKey},
			{"a", -1, 0, tierlimit.ErrInvalidCost},
			{"a", 0, -1, tierlimit.ErrInvalidCost},
			{"a", 11, 0, tierlimit.ErrInvalidCost},
			{"a", 0, 11, tierlimit.ErrInvalidCost},
		}
		for _, s := range settles {
			if _, err := l.Settle(ctx, s.key, s.charged, s.used); !errors.Is(err, s.want) {
				t.Errorf("%s: Settle(%q, %d, %d) = %v, want %v", alg.name, s.key, s.charged, s.used, err, s.want)
			}
		}
		for _, n := range []int64{-1, 11} {
			if _, err := l.WaitN(ctx, "a", n); !errors.Is(err, tierlimit.ErrInvalidCost) {
				t.Errorf("%s: WaitN(%d) = %v, want ErrInvalidCost", alg.name, n, err)
			}
		}
		if _, err := alg.new(rdb, tierlimit.PerSecond(1), WithLimitFunc(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("%s: WithLimitFunc(nil) = %v, want ErrInvalidOption", alg.name, err)
		}
	}
}

func manyTakes(n int) []tierlimit.Take {
	takes := make([]tierlimit.Take, n)
	for i := range takes {
		takes[i] = tierlimit.Take{Key: fmt.Sprint("k", i), N: 1}
	}
	return takes
}
