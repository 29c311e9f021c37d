package httplimit

import (
	"net/http"
)

// Quota units of the RateLimit fields (draft-ietf-httpapi-ratelimit-headers
// §3.1.2): what a limiter's cost counts. See WithLimiterCost.
const (
	// UnitRequests counts requests, each charged its cost: the draft's
	// default unit, the one of WithCost, never written out.
	UnitRequests = "requests"
	// UnitContentBytes counts the bytes of the content a request sends
	// or receives.
	UnitContentBytes = "content-bytes"
)

// maxUnitLen bounds quota unit names, so that the fields stay short.
const maxUnitLen = 32

// limiterCost is a WithLimiterCost waiting for New to find its limiter.
type limiterCost struct {
	name string
	unit string
	cost func(*http.Request) int64
}

// WithLimiterCost sets the cost of a request for one limiter, the one whose
// policy is name (the limiter given to New, named by WithName, or one
// added with WithLimiter), in place of the default cost of WithCost: with
// it, requests per second and bytes per second share a Middleware. unit
// says what the cost counts: UnitRequests, UnitContentBytes or another
// unit of the draft's registry (1 to 32 lower-case ASCII letters, digits
// and '-'); the RateLimit-Policy field advertises it as the policy's qu
// parameter, unless it is UnitRequests, the default.
//
// cost is called once per request the limiter is charged for, on the
// request's goroutine: not for a request its KeyFunc exempts, nor when
// an earlier limiter denied the request (the limiter then peeks, at cost
// 0; see Middleware). Its
// answer is charged as WithCost's is: 0 charges nothing, and a cost the
// limiter can never admit (negative, or above its burst) denies the
// request without Retry-After. New returns an error if no limiter has the
// policy name, or if two WithLimiterCost name one limiter.
func WithLimiterCost(name, unit string, cost func(*http.Request) int64) Option {
	return optionFunc(func(c *config) error {
		if err := checkUnit(unit); err != nil {
			return err
		}
		if cost == nil {
			return invalid("nil cost func for policy %q", name)
		}
		c.costs = append(c.costs, limiterCost{name: name, unit: unit, cost: cost})
		return nil
	})
}

// checkUnit reports whether unit may name a quota unit: a registry-style
// name, which needs no escape in a structured-field String.
func checkUnit(unit string) error {
	if unit == "" || len(unit) > maxUnitLen {
		return invalid("quota unit %q must be 1 to %d characters", unit, maxUnitLen)
	}
	for i := 0; i < len(unit); i++ {
		if b := unit[i]; (b < 'a' || b > 'z') && (b < '0' || b > '9') && b != '-' {
			return invalid("quota unit %q must be lower-case ASCII letters, digits and '-'", unit)
		}
	}
	return nil
}

// applyCosts gives the limiters named by WithLimiterCost their cost.
func applyCosts(byName map[string]*rule, costs []limiterCost) error {
	for _, c := range costs {
		r := byName[c.name]
		switch {
		case r == nil:
			return invalid("WithLimiterCost for policy %q: no limiter has that name", c.name)
		case r.cost != nil:
			return invalid("two WithLimiterCost for policy %q", c.name)
		}
		r.cost, r.unit = c.cost, c.unit
	}
	return nil
}
