package httplimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"github.com/tierlimit/tierlimit/internal/clientip"
)

// Defaults of the options.
const (
	// DefaultPolicy is the policy name of the limiter given to New, before
	// the limit in the names of its quotas (see WithName).
	DefaultPolicy = "default"
	// DefaultIPv6Prefix is the prefix length an IPv6 client is keyed by:
	// one customer usually holds a whole /64, and rotating addresses
	// inside it must not give it more quota.
	DefaultIPv6Prefix = 64
)

// The headers a trusted proxy may name the client in; see
// WithProxyHeader.
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded" // RFC 7239
)

// KeyFunc returns the key a request is limited by. clientIP is the
// client's address as the middleware resolved it (see WithTrustedProxies),
// or "" if the request has none. ok false exempts the request from this
// limiter; the other limiters still apply. An empty key with ok true is an
// error: the request is refused with 500 (see Middleware). A key longer
// than tierlimit.MaxKeyLen is replaced by its SHA-256, so no key is
// refused for its length.
//
// The limiter may keep the key for as long as it tracks it: a key sliced
// from a large string keeps that string alive.
type KeyFunc func(r *http.Request, clientIP string) (key string, ok bool)

// KeyHeader returns a KeyFunc that limits by the value of the request
// header name, e.g. "X-API-Key"; requests without it are exempt from the
// limiter. A header is only as trustworthy as its sender: key by an
// authenticated identity where a client could invent values.
func KeyHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ string) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	}
}

// Option configures a Middleware.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config is what the options set; New turns it into a Middleware.
type config struct {
	name       string  // the first limiter's policy
	key        KeyFunc // the first limiter's key; nil: the client IP
	extra      []*rule
	trusted    []netip.Prefix
	header     string
	v6bits     int
	cost       func(*http.Request) int64
	costs      []limiterCost
	pks        []limiterPK
	shadow     bool
	legacy     bool
	denied     http.Handler
	concDenied http.Handler
	failed     http.Handler // nil: fail open
	onError    func(*http.Request, error)
	logger     *slog.Logger
	onDecision DecisionFunc
	conc       tierlimit.Concurrency
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("httplimit: %w: "+format, append([]any{tierlimit.ErrInvalidOption}, args...)...)
}

// checkPolicy reports whether name may name a policy (chain.CheckPolicy).
func checkPolicy(name string) error { return chain.CheckPolicy("httplimit", name) }

// WithName sets the policy name of the limiter given to New (default
// DefaultPolicy): 1 to 64 printable ASCII characters, distinct from the
// names given to WithLimiter. Its quotas appear in the RateLimit fields
// under this name followed by their limit, e.g. "api:10/1s" (see
// Middleware).
func WithName(name string) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicy(name); err != nil {
			return err
		}
		c.name = name
		return nil
	})
}

// WithKey sets how requests are keyed for the limiter given to New
// (default: by client IP, see WithTrustedProxies and WithIPv6Prefix).
func WithKey(key KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if key == nil {
			return invalid("nil key func")
		}
		c.key = key
		return nil
	})
}

// WithLimiter adds a limiter asked for every request besides the one given
// to New, e.g. a per-user limit next to a per-route one. name is its policy
// in the RateLimit fields (as for WithName); key keys requests for it (nil:
// by client IP). The limiters are asked in order, the one given to New
// first; see Middleware for how a denial by one affects the others.
func WithLimiter(name string, limiter tierlimit.Limiter, key KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicy(name); err != nil {
			return err
		}
		if limiter == nil {
			return invalid("nil limiter for policy %q", name)
		}
		c.extra = append(c.extra, &rule{name: name, lim: limiter, key: key, unit: UnitRequests})
		return nil
	})
}

// WithTrustedProxies sets the proxies whose client header (see
// WithProxyHeader) is believed: CIDRs such as "10.0.0.0/8" or single
// addresses. By default no proxy is trusted and the client IP is the
// peer's, from Request.RemoteAddr. With trusted proxies, a request whose
// peer is one of them is keyed by the right-most address of the header
// that is not a trusted proxy, looked for among the header's last 16
// elements and 4 KiB; see Middleware.
func WithTrustedProxies(cidrs ...string) Option {
	return optionFunc(func(c *config) error {
		trusted, err := clientip.AppendTrusted(c.trusted, cidrs)
		if err != nil {
			return invalid("%v", err)
		}
		c.trusted = trusted
		return nil
	})
}

// WithProxyHeader sets the header trusted proxies name the client in:
// HeaderXForwardedFor (the default) or HeaderForwarded (RFC 7239). Only
// that one is read: a proxy that appends to one header passes the other
// through as the client sent it.
func WithProxyHeader(name string) Option {
	return optionFunc(func(c *config) error {
		switch h := http.CanonicalHeaderKey(name); h {
		case HeaderXForwardedFor, HeaderForwarded:
			c.header = h
			return nil
		}
		return invalid("proxy header %q must be %q or %q", name, HeaderXForwardedFor, HeaderForwarded)
	})
}

// WithIPv6Prefix sets the prefix length, 1 to 128, an IPv6 client is keyed
// by (default DefaultIPv6Prefix): every address of one /64 is one client.
// IPv4 clients, and IPv4-mapped IPv6 addresses, are keyed by their
// address.
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(c *config) error {
		if bits < 1 || bits > 128 {
			return invalid("IPv6 prefix /%d must be between /1 and /128", bits)
		}
		c.v6bits = bits
		return nil
	})
}

// WithCost sets the default cost of a request (default 1), asked of every
// limiter without a cost of its own (WithLimiterCost), in requests. It is
// called at most once per request, when the first such limiter is asked.
// A cost of 0 charges nothing; a cost a limiter can never admit (negative,
// or above its burst) is denied without Retry-After.
func WithCost(cost func(*http.Request) int64) Option {
	return optionFunc(func(c *config) error {
		if cost == nil {
			return invalid("nil cost func")
		}
		c.cost = cost
		return nil
	})
}

// WithShadow turns on shadow mode, for rolling out a limit: requests are
// decided and charged, and the headers are set, as when enforcing, but a
// denied request is served instead of refused. Observe the limiters (e.g.
// with package metrics) to see what enforcing would deny. Shadow mode
// refuses nothing, so that a mistake in what is being rolled out cannot
// refuse requests: a request with no valid limit or number of permits for
// its key, or with an empty key from a KeyFunc, is served too, and
// reported (WithErrorFunc, or logged) as a request enforcing would
// refuse; a blocked key's denials reach WithDecisionFunc as every denial
// does.
func WithShadow() Option {
	return optionFunc(func(c *config) error {
		c.shadow = true
		return nil
	})
}

// WithLegacyHeaders adds X-RateLimit-Limit (the bucket's capacity),
// X-RateLimit-Remaining and X-RateLimit-Reset (seconds until the bucket is
// full again, rounded up) for clients that predate the RateLimit fields.
func WithLegacyHeaders() Option {
	return optionFunc(func(c *config) error {
		c.legacy = true
		return nil
	})
}

// WithDeniedHandler sets the handler that answers a denied request. It
// runs with the RateLimit fields and Retry-After already set. The default
// answers 429 Too Many Requests with a short plain-text body.
func WithDeniedHandler(h http.Handler) Option {
	return optionFunc(func(c *config) error {
		if h == nil {
			return invalid("nil denied handler")
		}
		c.denied = h
		return nil
	})
}

// WithFailClosed refuses requests when a limiter fails (a backend error):
// h answers them (nil: 503 Service Unavailable). By default the middleware
// fails open: the failing limiter is left out and the request goes on,
// since an outage of the limiter's store should not become an outage of
// the service. In shadow mode nothing is refused, whatever this says.
func WithFailClosed(h http.Handler) Option {
	return optionFunc(func(c *config) error {
		if h == nil {
			h = http.HandlerFunc(unavailable)
		}
		c.failed = h
		return nil
	})
}

// WithErrorFunc sets a func told of every limiter error, with the request,
// e.g. to log it; it runs on the request's goroutine before the request is
// served or refused. The middleware then passes errors to nothing else
// (without it, they are logged at most once every 10 seconds).
func WithErrorFunc(f func(r *http.Request, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil error func")
		}
		c.onError = f
		return nil
	})
}

// WithLogger sets the logger limiter errors are logged to when there is
// no WithErrorFunc (default: slog.Default(), read when a line is logged).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	})
}

// DecisionFunc is told of every decision a limiter makes about a request,
// on the request's goroutine, with the request's context and the
// limiter's policy name, e.g. to add it to the request's span (package
// otelbridge's SpanDecision): the middleware itself imports no tracing.
type DecisionFunc func(ctx context.Context, policy string, res tierlimit.Result)

// WithDecisionFunc sets a func told of the decisions of the limiters (see
// DecisionFunc), in order, up to the first denial: the peeks after it
// (see Middleware) are not told, so the last decision told is the one
// that settled the request.
func WithDecisionFunc(f DecisionFunc) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil decision func")
		}
		c.onDecision = f
		return nil
	})
}
