package httplimit

import (
	"math/bits"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit"
)

// validLimit reports whether l can be advertised: a limiter that does not
// say which limit decided leaves Result.Limit zero.
func validLimit(l tierlimit.Limit) bool { return l.Rate > 0 && l.Period > 0 }

// appendQuotaName appends the name of the quota l of the limiter ru, as a
// structured-field String: "name:rate/period", with " burst N" when the
// burst is not the rate, e.g. "api:10/1s" or "api:10/1s burst 50". The
// limit is in the name so that one name never stands for two quotas: a
// limiter with several limits, or with a limit per key, reports one name
// per limit, the same on every instance, with no configuration. Without
// a valid limit the name is the policy's alone.
func appendQuotaName(buf []byte, ru *rule, l tierlimit.Limit) []byte {
	buf = append(buf, ru.prefix...)
	if validLimit(l) {
		buf = append(buf, ':')
		buf = strconv.AppendInt(buf, l.Rate, 10)
		buf = append(buf, '/')
		buf = appendPeriod(buf, l.Period)
		if c := l.Capacity(); c != l.Rate {
			buf = append(buf, " burst "...)
			buf = strconv.AppendInt(buf, c, 10)
		}
	}
	return append(buf, '"')
}

// quotaNames caches the quota names of one limiter's limits, so that the
// names of a request's policies are copied rather than formatted twice:
// it exists for BenchmarkOverhead, where formatting them showed. It holds the first maxQuotaNames limits seen; the
// names of later ones are formatted on every use, so that neither memory
// nor allocations grow with the number of limits a LimitFunc hands out.
// It is safe for concurrent use: a miss copies the list and swaps it in,
// and a lost race only leaves a name to be cached on a later miss.
type quotaNames struct {
	list atomic.Pointer[[]quotaName]
}

// quotaName is one cached name.
type quotaName struct {
	limit  tierlimit.Limit
	quoted string
}

// maxQuotaNames bounds a limiter's cached quota names: the plans of a
// service, the limits of remote.WithLimits.
const maxQuotaNames = 16

// appendName appends the name of ru's quota l, as appendQuotaName does.
func (ns *quotaNames) appendName(buf []byte, ru *rule, l tierlimit.Limit) []byte {
	old := ns.list.Load()
	if old != nil {
		for i := range *old {
			if (*old)[i].limit == l {
				return append(buf, (*old)[i].quoted...)
			}
		}
	}
	start := len(buf)
	buf = appendQuotaName(buf, ru, l)
	if old == nil || len(*old) < maxQuotaNames {
		var list []quotaName
		if old != nil {
			list = append(make([]quotaName, 0, len(*old)+1), *old...)
		}
		list = append(list, quotaName{limit: l, quoted: string(buf[start:])})
		ns.list.CompareAndSwap(old, &list)
	}
	return buf
}

// periodUnits are the units appendPeriod writes a period in, largest
// first.
var periodUnits = [...]struct {
	d    time.Duration
	name string
}{
	{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"},
	{time.Millisecond, "ms"}, {time.Microsecond, "us"}, {time.Nanosecond, "ns"},
}

// appendPeriod appends d > 0 as a whole number of its largest unit that
// divides it: "1s", "90s", "24h", "1500ms".
func appendPeriod(buf []byte, d time.Duration) []byte {
	for _, u := range periodUnits {
		if d%u.d == 0 {
			buf = strconv.AppendInt(buf, int64(d/u.d), 10)
			return append(buf, u.name...)
		}
	}
	return buf // unreachable: every Duration is a whole number of ns
}

// quota expresses l as q events per w whole seconds, as the w parameter
// must be: a period of a whole number of seconds is kept, any other is
// rounded up to one and q scaled down to it (never advertising more than
// l allows). l must have Rate and Period > 0.
func quota(l tierlimit.Limit) (q, w int64) {
	if l.Period%time.Second == 0 {
		return l.Rate, int64(l.Period / time.Second)
	}
	w = seconds(l.Period)
	hi, lo := bits.Mul64(uint64(l.Rate), uint64(w)*uint64(time.Second))
	if hi >= uint64(l.Period) { // beyond any valid Limit: the quotient would overflow
		return maxSFInt, w
	}
	quo, _ := bits.Div64(hi, lo, uint64(l.Period))
	return int64(min(quo, maxSFInt)), w
}

// effectiveWindow returns the t parameter of res, the effective window of
// the draft's §4.1.2: the time within which the key can use no more than
// its Remaining, that is until it has one unit more. It is not the time
// until the key is full (ResetAfter), which would tell a client of a
// drained 100/min bucket to wait a minute when it may send one request
// every 0.6 s.
//
// A Result says when the key is full, not when its next unit comes, so
// the time is derived from ResetAfter. A token bucket (local, hybrid,
// remote's token bucket and GCRA) holds between Remaining and Remaining+1
// tokens, so its ResetAfter lies between the refill times of the missing
// tokens but one and of all of them, and the next token comes after
// ResetAfter less the refill of the missing tokens but one: exact. A
// ResetAfter past those bounds but within the limit's Period comes from a
// window, whose units come back at once when it moves on: the window is
// ResetAfter. One past the Period is another limit's: with several limits
// on one key (remote.WithLimits), Limit is the one with the fewest units
// left and ResetAfter the time until all of them are full; Limit's next
// unit then comes within one refill interval, which t is. A full key gets
// its next unit one refill interval after it spends. When res is a
// denial, t is at most RetryAfter, so that Retry-After never points
// before the end of the window (draft §6).
func effectiveWindow(res tierlimit.Result) time.Duration {
	t, l := res.ResetAfter, res.Limit
	if validLimit(l) {
		missing := l.Capacity() - max(res.Remaining, 0)
		switch {
		case missing <= 0, t > l.Period:
			t = l.RefillTime(1)
		case t > 0 && refillsWithin(l, missing-1, t-1) && !refillsWithin(l, missing, t-1):
			t -= l.RefillTime(missing - 1)
		}
	}
	if !res.Allowed {
		t = min(t, res.RetryAfter)
	}
	return t
}

// refillsWithin reports whether l's bucket refills n tokens within d,
// that is RefillTime(n) <= d: n·Period <= d·Rate, in 128 bits, without
// RefillTime's division, which BenchmarkOverhead showed on every request.
func refillsWithin(l tierlimit.Limit, n int64, d time.Duration) bool {
	nh, nl := bits.Mul64(uint64(n), uint64(l.Period))
	dh, dl := bits.Mul64(uint64(d), uint64(l.Rate))
	return nh < dh || nh == dh && nl <= dl
}

// seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}
