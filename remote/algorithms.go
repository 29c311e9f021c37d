package remote

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/lua"
)

var (
	tokenBucketAlg = &algorithm{
		name: "tb", script: lua.TokenBucket, keys: []string{""},
		params: func(l tierlimit.Limit) []any {
			unit, per := l.Scale()
			return []any{unit, per, l.Capacity() * unit}
		},
		capacity: tierlimit.Limit.Capacity,
	}
	gcraAlg = &algorithm{
		name: "gcra", script: lua.GCRA, keys: []string{""},
		params: func(l tierlimit.Limit) []any {
			t := emission(l)
			return []any{t, l.Capacity() * t}
		},
		capacity: tierlimit.Limit.Capacity,
	}
	fixedWindowAlg    = windowAlg("fw", lua.FixedWindow, []string{""})
	anchoredWindowAlg = windowAlg("aw", lua.AnchoredWindow, []string{""})
	slidingLogAlg     = windowAlg("sl", lua.SlidingLog, []string{":z", ":h"})
	slidingWindowAlg  = &algorithm{
		name: "sw", script: lua.SlidingWindow, keys: []string{""},
		params: func(l tierlimit.Limit) []any {
			p := l.PeriodMicros()
			return []any{p, l.Rate, grain(l.Rate, p)}
		},
		validate: windowBurst,
		capacity: rate,
	}
)

// ledgerAlg is the token bucket with a ledger of held leases
// (WithLeaseLedger), whose holders promise to spend nothing hold after
// their last grant. Its state key is the token bucket's: the ledger is a
// hash beside it.
func ledgerAlg(hold time.Duration) *algorithm {
	holdMicros := hold.Microseconds()
	return &algorithm{
		name: "tb", script: lua.Ledger, keys: []string{"", ":held"}, holders: true,
		params: func(l tierlimit.Limit) []any {
			return append(tokenBucketAlg.params(l), holdMicros)
		},
		capacity: tierlimit.Limit.Capacity,
	}
}

// noHolder is the ARGV tail of a ledger call that names no holder: gen 0,
// held -1, holder "".
var noHolder = []any{0, -1, ""}

// emission is GCRA's interval between two events in µs, rounded up so that
// GCRA never admits faster than the limit.
func emission(l tierlimit.Limit) int64 {
	p := l.PeriodMicros()
	return (p + l.Rate - 1) / l.Rate
}

// grain returns the sliding window's weight grain in µs: the smallest q with
// rate × (period / q) below 2^51, so that the script's products stay exact.
func grain(rate, period int64) int64 {
	q := int64(1)
	for rate > (1<<51)/(period/q) {
		q *= 2
	}
	return q
}

func windowAlg(name string, s *redis.Script, keys []string) *algorithm {
	return &algorithm{
		name: name, script: s, keys: keys,
		params:   func(l tierlimit.Limit) []any { return []any{l.PeriodMicros(), l.Rate} },
		validate: windowBurst,
		capacity: rate,
	}
}

func rate(l tierlimit.Limit) int64 { return l.Rate }

// windowBurst rejects a Burst on window algorithms: they count Rate per
// window and have no bucket.
func windowBurst(l tierlimit.Limit) error {
	if l.Burst != 0 && l.Burst != l.Rate {
		return fmt.Errorf("%w: window algorithms admit Rate per Period and have no burst (got burst %d, rate %d)",
			tierlimit.ErrInvalidLimit, l.Burst, l.Rate)
	}
	return nil
}
