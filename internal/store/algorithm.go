package store

import (
	"fmt"
	"math/bits"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/script"
)

// Algorithm describes one script: how its keys are named and what it is
// told about each limit. The values are the package's variables.
type Algorithm struct {
	name     string // short name in Redis keys, e.g. "tb"
	script   *redis.Script
	keys     []string                     // key suffixes per entry, e.g. {""} or {":z", ":h"}
	spec     func(tierlimit.Limit) string // a limit as ARGV and the state spell it
	validate func(tierlimit.Limit) error  // rules beyond Limit.Validate
	capacity func(tierlimit.Limit) int64  // largest cost one call may ask
	ledger   bool                         // ledger.lua's: leases to holders (Lease, LeaseBatch, Refund)
}

// Name returns the algorithm's name as its Redis keys carry it: "tb",
// "gcra", "fw", "aw", "sl" or "sw".
func (a *Algorithm) Name() string { return a.name }

// The algorithms, by the name their keys carry.
var (
	TokenBucket = &Algorithm{
		name: "tb", script: script.TokenBucket, keys: []string{""},
		spec: func(l tierlimit.Limit) string {
			unit, per := l.Scale()
			return join(unit, per, l.Capacity())
		},
		capacity: tierlimit.Limit.Capacity,
	}
	GCRA = &Algorithm{
		name: "gcra", script: script.GCRA, keys: []string{""},
		spec: func(l tierlimit.Limit) string {
			unit, per := l.Scale()
			ti, tf := tolerance(l)
			return join(unit, per, ti, tf, l.Capacity())
		},
		capacity: tierlimit.Limit.Capacity,
	}
	FixedWindow    = windowAlg("fw", script.FixedWindow, []string{""})
	AnchoredWindow = windowAlg("aw", script.AnchoredWindow, []string{""})
	SlidingLog     = logAlg()
	SlidingWindow  = &Algorithm{
		name: "sw", script: script.SlidingWindow, keys: []string{""},
		spec: func(l tierlimit.Limit) string {
			p := l.PeriodMicros()
			return join(p, l.Rate, grain(l.Rate, p))
		},
		validate: windowBurst,
		capacity: rate,
	}
)

// Algorithms lists every algorithm, the token bucket first.
var Algorithms = []*Algorithm{TokenBucket, GCRA, FixedWindow, AnchoredWindow, SlidingLog, SlidingWindow}

// ledger is the token bucket with a ledger of held leases (Config.Hold),
// whose holders promise to spend nothing hold after their last grant. Its
// key is the token bucket's: the ledger's records follow the bucket's state
// in the same string (ledger.lua), which tokenbucket.lua keeps as it is.
func ledger() *Algorithm {
	return &Algorithm{
		name: "tb", script: script.Ledger, keys: []string{""}, ledger: true,
		spec: TokenBucket.spec, capacity: tierlimit.Limit.Capacity,
	}
}

// join spells integers as a limit's spec: "a:b:c".
func join(xs ...int64) string {
	b := make([]byte, 0, 64)
	for i, x := range xs {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return string(b)
}

// tolerance returns GCRA's tau = Capacity × Period/Rate µs as ti + tf/per
// µs (per from Limit.Scale, 0 <= tf < per), in 128 bits: Capacity × unit
// may pass 64. The quotient is the bucket's fill time, below
// tierlimit.MaxFill.
func tolerance(l tierlimit.Limit) (ti, tf int64) {
	unit, per := l.Scale()
	hi, lo := bits.Mul64(uint64(l.Capacity()), uint64(unit))
	q, r := bits.Div64(hi, lo, uint64(per))
	return int64(q), int64(r)
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

func windowAlg(name string, s *redis.Script, keys []string) *Algorithm {
	return &Algorithm{
		name: name, script: s, keys: keys,
		spec:     func(l tierlimit.Limit) string { return join(l.PeriodMicros(), l.Rate) },
		validate: windowBurst,
		capacity: rate,
	}
}

// MaxLogRate bounds the sliding log's Rate: it keeps one sorted-set member
// (about 100 bytes) per admitted request of the last Period, up to Rate
// of them per key.
const MaxLogRate = 1_000_000

func logAlg() *Algorithm {
	a := windowAlg("sl", script.SlidingLog, []string{":z", ":h"})
	a.validate = func(l tierlimit.Limit) error {
		if l.Rate > MaxLogRate {
			return fmt.Errorf("%w: the sliding log keeps a sorted-set member per request, up to Rate per key: rate %d is above %d (the sliding window or the token bucket take it)",
				tierlimit.ErrInvalidLimit, l.Rate, MaxLogRate)
		}
		return windowBurst(l)
	}
	return a
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

// Spec returns limit as the algorithm's scripts receive it and its states
// record it (docs/operations.md, "Key format"): what a state ends with
// when it was written under limit. The sliding log's state records none.
func (a *Algorithm) Spec(limit tierlimit.Limit) string { return a.spec(limit) }
