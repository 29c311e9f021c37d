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
// gets none is refused as a denial is (429, or WithDeniedHandler's
// handler), without waiting. An error of c follows the error policy:
// reported, then the request is served (fail open) or refused
// (WithFailClosed); an invalid number of permits for the key refuses the
// request. Under WithShadow no request is refused.
func WithConcurrency(c tierlimit.Concurrency) Option {
	return optionFunc(func(cfg *config) error {
		if c == nil {
			return invalid("nil concurrency limiter")
		}
		cfg.conc = c
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
		key, ok = k(r, key)
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
			m.denied.ServeHTTP(w, r)
			return
		}
	case errors.Is(err, tierlimit.ErrInvalidLimit):
		m.report(r, fmt.Errorf("httplimit: concurrency: request refused with 429, the limiter has no valid number of permits for its key: %w", err), false)
		if !m.shadow {
			m.denied.ServeHTTP(w, r)
			return
		}
	default:
		m.report(r, fmt.Errorf("httplimit: concurrency: %w", err), true)
		if m.failed != nil && !m.shadow {
			m.failed.ServeHTTP(w, r)
			return
		}
	}
	h.next.ServeHTTP(w, r)
}
