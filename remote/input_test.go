package remote

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TestBadInput checks every bad input of every limiter's constructor, a
// cost over the smallest of WithLimits's bursts, and bad claims and
// refunds of the store, against their errors (the input rules every tier
// shares are TestInputRules's, at the module's root). Validation happens
// before any network call, so the client points nowhere.
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
		{"nil LimitFunc", rdb, ok, []Option{WithLimitFunc(nil)}, tierlimit.ErrInvalidOption},
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
		// The input rules every tier shares are TestInputRules's, at the
		// module's root; a cost over the smallest of WithLimits's bursts is
		// remote's own.
		if _, err := d.AllowN(ctx, "k", 9); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("%s: AllowN(cost over the smallest burst) = %v, want ErrInvalidCost", alg.name, err)
		}
	}

}
