package httplimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit"
)

// Policy names the quota that SetHeaders reports a decision under, as the
// options of a Middleware name a limiter's.
type Policy struct {
	Name   string // as WithName's: 1 to 64 printable ASCII characters
	Unit   string // as WithLimiterCost's unit; "" for UnitRequests
	Legacy bool   // also the X-RateLimit-* headers, as WithLegacyHeaders
}

// fieldNames are every header SetHeaders may set, which it first deletes.
var fieldNames = [...]string{hPolicy, hRateLimit, hRetryAfter, hXLimit, hXRemaining, hXReset}

// SetHeaders sets in h the RateLimit fields of res, a decision a handler
// made itself (AllowAll, WaitN, Settle, or AllowN without a Middleware),
// as a Middleware sets them for one limiter named p.Name: RateLimit-Policy
// from res.Limit (with the burst, when it exceeds q), RateLimit, and when
// res is a denial Retry-After, except for a key its LimitFunc blocks
// (tierlimit.Blocked: no promise of when it opens); the X-RateLimit-*
// headers too with p.Legacy. It first deletes every field it may set, so
// that the response never carries another limiter's (a Middleware's in
// front of the handler): call it after the Middleware has run, before
// the handler writes its status. It returns an error wrapping
// tierlimit.ErrInvalidOption for a bad name or unit, and then leaves h as
// it was.
func SetHeaders(h http.Header, p Policy, res tierlimit.Result) error {
	if err := checkPolicy(p.Name); err != nil {
		return err
	}
	ru := &rule{name: p.Name, unit: UnitRequests}
	if p.Unit != "" {
		if err := checkUnit(p.Unit); err != nil {
			return err
		}
		ru.unit = p.Unit
	}
	ru.setPrefix()
	for _, f := range fieldNames {
		delete(h, f)
	}
	outs := []outcome{{rule: ru, res: res, never: res.Limit.IsBlocked()}}
	setHeaders(h, outs, !res.Allowed, p.Legacy)
	return nil
}
