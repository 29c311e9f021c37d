package httplimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
)

// WithConcurrency limits the requests in flight per key with c (see
// tierlimit.Concurrency), keyed as the limiter given to New is (WithKey,
// or the client IP). A request the rate limiters admit asks c for a permit
// with TryAcquire and holds it until the handler returns; a request that
// gets none is refused without waiting, by WithConcurrencyDeniedHandler's
// handler (default: 429 Too Many Requests, whose body says too many
// requests are in flight). The refusal carries no Retry-After, since
// nothing says when a request in flight ends, and none of the RateLimit
// fields the rate limiters wrote, which describe limits that admitted the
// request. An error of c follows the error policy: reported, then the
// request is served (fail open) or refused (WithFailClosed); an invalid
// number of permits for the key (tierlimit.ErrInvalidLimit, from a
// PermitFunc) refuses the request under every policy, as a refusal for
// want of a permit is, and is reported. Under WithShadow no request is
// refused.
func WithConcurrency(c tierlimit.Concurrency) Option {
	return optionFunc(func(cfg *config) error {
		if c == nil {
			return invalid("nil concurrency limiter")
		}
		cfg.conc = c
		return nil
	})
}

// WithConcurrencyDeniedHandler sets the handler that answers a request
// WithConcurrency's limiter refuses (no permit free, or no valid number
// of permits for its key). It runs with no RateLimit field and no
// Retry-After set. The default answers 429 Too Many Requests with a short
// plain-text body that says too many requests are in flight.
func WithConcurrencyDeniedHandler(h http.Handler) Option {
	return optionFunc(func(c *config) error {
		if h == nil {
			return invalid("nil concurrency denied handler")
		}
		c.concDenied = h
		return nil
	})
}

// concHandler holds a permit of the Middleware's concurrency limiter while
// next serves a request.
type concHandler struct {
	m    *Middleware
	next http.Handler
}

func (h *concHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	key, ok := m.ip.clientIP(r)
	if k := m.rules[0].key; k != nil {
		if key, ok = k(r, key); ok && key == "" {
			m.report(r, fmt.Errorf("httplimit: concurrency: request %s: its KeyFunc returned an empty key for a limited request: %w",
				m.verdict(http.StatusInternalServerError), tierlimit.ErrInvalidKey), false)
			if !m.shadow {
				clearFields(w.Header())
				noKey(w, r)
				return
			}
		}
	}
	if !ok || key == "" {
		h.next.ServeHTTP(w, r)
		return
	}
	p, ok, err := m.conc.TryAcquire(r.Context(), chain.ShortKey(key))
	switch {
	case err == nil && ok:
		defer p.Release()
	case err == nil: // no permit free
		if !m.shadow {
			h.refuse(w, r)
			return
		}
	case errors.Is(err, tierlimit.ErrInvalidLimit):
		m.report(r, fmt.Errorf("httplimit: concurrency: request %s, the limiter has no valid number of permits for its key: %w",
			m.verdict(http.StatusTooManyRequests), err), false)
		if !m.shadow {
			h.refuse(w, r)
			return
		}
	default:
		m.report(r, fmt.Errorf("httplimit: concurrency: %w", err), true)
		if m.failed != nil && !m.shadow {
			clearFields(w.Header())
			m.failed.ServeHTTP(w, r)
			return
		}
	}
	h.next.ServeHTTP(w, r)
}

// refuse answers a request the concurrency limiter refused, without the
// fields of the rate limiters, which admitted it.
func (h *concHandler) refuse(w http.ResponseWriter, r *http.Request) {
	clearFields(w.Header())
	h.m.concDenied.ServeHTTP(w, r)
}

// clearFields deletes the fields setHeaders writes.
func clearFields(h http.Header) {
	for _, k := range [...]string{hPolicy, hRateLimit, hRetryAfter, hXLimit, hXRemaining, hXReset} {
		delete(h, k)
	}
}

// tooManyInFlight is the default handler of WithConcurrencyDeniedHandler.
func tooManyInFlight(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "Too Many Requests: too many requests in flight", http.StatusTooManyRequests)
}
