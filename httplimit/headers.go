package httplimit

import (
	"math/bits"
	"net/http"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit"
)

// Header keys in canonical form, written straight into the header map:
// Header.Set would copy "RateLimit" to "Ratelimit" on every request. Names
// are case-insensitive on the wire.
const (
	hPolicy     = "Ratelimit-Policy"
	hRateLimit  = "Ratelimit"
	hRetryAfter = "Retry-After"
	hXLimit     = "X-Ratelimit-Limit"
	hXRemaining = "X-Ratelimit-Remaining"
	hXReset     = "X-Ratelimit-Reset"
)

// maxSFInt is the largest structured-field Integer (RFC 9651, 3.3.1).
const maxSFInt = 999_999_999_999_999

// setHeaders writes the fields for outs. The values are formatted into one
// buffer and become substrings of one string, and the header slices share
// one array: two allocations, whatever the number of fields.
func (m *Middleware) setHeaders(h http.Header, outs []outcome, refused bool) {
	win := mostRestrictive(outs)
	var (
		stack [128]byte // enough for the fields of two limiters; more spill to the heap
		keys  [6]string
		ends  [6]int
		k     int
	)
	buf := stack[:0]
	mark := func(key string) {
		keys[k], ends[k] = key, len(buf)
		k++
	}

	for i := range outs {
		if lim := outs[i].res.Limit; lim.Rate > 0 && lim.Period > 0 {
			if len(buf) > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicy(buf, outs[i].rule.quoted, lim)
		}
	}
	if len(buf) > 0 {
		mark(hPolicy)
	}

	res := win.res
	buf = append(buf, win.rule.quoted...)
	buf = append(buf, ";r="...)
	buf = appendSFInt(buf, res.Remaining)
	if !win.never {
		t := res.ResetAfter
		if !res.Allowed {
			t = res.RetryAfter
		}
		buf = append(buf, ";t="...)
		buf = appendSFInt(buf, seconds(t))
	}
	mark(hRateLimit)

	if refused && !win.never {
		buf = strconv.AppendInt(buf, seconds(res.RetryAfter), 10)
		mark(hRetryAfter)
	}
	if m.legacy {
		if res.Limit.Rate > 0 {
			buf = strconv.AppendInt(buf, res.Limit.Capacity(), 10)
			mark(hXLimit)
		}
		buf = strconv.AppendInt(buf, max(res.Remaining, 0), 10)
		mark(hXRemaining)
		buf = strconv.AppendInt(buf, seconds(res.ResetAfter), 10)
		mark(hXReset)
	}

	s := string(buf)
	vals := make([]string, k)
	from := 0
	for i := range k {
		vals[i] = s[from:ends[i]]
		h[keys[i]] = vals[i : i+1 : i+1]
		from = ends[i]
	}
}

// mostRestrictive returns the outcome the RateLimit field reports: a
// denial over an admission; among denials, one that can never pass, else
// the longest RetryAfter; among admissions, the fewest tokens left. Ties go
// to the earlier limiter.
func mostRestrictive(outs []outcome) *outcome {
	w := &outs[0]
	for i := 1; i < len(outs); i++ {
		if o := &outs[i]; o.worse(w) {
			w = o
		}
	}
	return w
}

func (o *outcome) denied() bool { return o.never || !o.res.Allowed }

// worse reports whether o restricts the client more than p.
func (o *outcome) worse(p *outcome) bool {
	switch {
	case o.denied() != p.denied():
		return o.denied()
	case !o.denied():
		return o.res.Remaining < p.res.Remaining
	case o.never != p.never:
		return o.never
	}
	return o.res.RetryAfter > p.res.RetryAfter
}

// appendPolicy appends a quota policy item: "name";q=Q;w=W, quoted being
// "name" as a structured-field String.
func appendPolicy(buf []byte, quoted string, l tierlimit.Limit) []byte {
	q, w := quota(l)
	buf = append(buf, quoted...)
	buf = append(buf, ";q="...)
	buf = appendSFInt(buf, q)
	buf = append(buf, ";w="...)
	return appendSFInt(buf, w)
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

// seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}

// appendSFInt appends a structured-field Integer, clamped to its range
// (and to 0 from below: every parameter here is non-negative).
func appendSFInt(buf []byte, v int64) []byte {
	return strconv.AppendInt(buf, min(max(v, 0), maxSFInt), 10)
}

// appendSFString appends a structured-field String. s is printable ASCII
// (checkPolicy).
func appendSFString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			buf = append(buf, '\\')
		}
		buf = append(buf, s[i])
	}
	return append(buf, '"')
}
