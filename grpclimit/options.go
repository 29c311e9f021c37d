package grpclimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"github.com/tierlimit/tierlimit/internal/clientip"
)

// Defaults of the options.
const (
	// DefaultPolicy is the name of the limiter given to New (see
	// WithName), which denials name.
	DefaultPolicy = "default"
	// DefaultIPv6Prefix is the prefix length an IPv6 peer is keyed by:
	// one customer usually holds a whole /64.
	DefaultIPv6Prefix = 64
)

// The metadata keys a trusted proxy may name the client in; see
// WithProxyHeader. gRPC metadata keys are lower case.
const (
	MetadataXForwardedFor = "x-forwarded-for"
	MetadataForwarded     = "forwarded" // RFC 7239
)

// KeyFunc returns the key a call to fullMethod ("/pkg.Service/Method") is
// limited by; ctx is the call's, with its metadata and peer. ok false
// exempts the call from this limiter; the other limiters still apply. An
// empty key with ok true is an error: the call is refused with
// codes.Internal (see Interceptor). A key longer than tierlimit.MaxKeyLen
// is replaced by its SHA-256.
type KeyFunc func(ctx context.Context, fullMethod string) (key string, ok bool)

// KeyMetadata returns a KeyFunc that limits by the first value of the
// incoming metadata key name (e.g. "x-api-key"); calls without it are
// exempt. Metadata is only as trustworthy as its sender: key by an
// authenticated identity where a client could invent values.
func KeyMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, bool) {
		v := metadata.ValueFromIncomingContext(ctx, name)
		if len(v) == 0 {
			return "", false
		}
		return v[0], v[0] != ""
	}
}

// KeyMethod is a KeyFunc that limits by the full method: one bucket per
// method, shared by every client.
func KeyMethod(_ context.Context, fullMethod string) (string, bool) {
	return fullMethod, true
}

// DecisionFunc is told of every decision a limiter makes about a call, on
// the call's goroutine, with the call's context and the limiter's name,
// e.g. to add it to the call's span (package otelbridge's SpanDecision).
type DecisionFunc func(ctx context.Context, policy string, res tierlimit.Result)

// Option configures an Interceptor.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config is what the options set; New turns it into an Interceptor.
type config struct {
	name       string
	key        KeyFunc // nil: the peer
	extra      []*rule
	messages   []*rule
	trusted    []netip.Prefix
	forwarded  bool
	v6bits     int
	cost       func(ctx context.Context, fullMethod string) int64
	shadow     bool
	failClosed bool
	onError    func(ctx context.Context, fullMethod string, err error)
	onDecision DecisionFunc
	logger     *slog.Logger
	conc       tierlimit.Concurrency
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("grpclimit: %w: "+format, append([]any{tierlimit.ErrInvalidOption}, args...)...)
}

// checkPolicy reports whether name may name a policy (chain.CheckPolicy).
func checkPolicy(name string) error { return chain.CheckPolicy("grpclimit", name) }

// WithName sets the name of the limiter given to New (default
// DefaultPolicy), which its denials name: 1 to 64 printable ASCII
// characters, distinct from the names given to WithLimiter.
func WithName(name string) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicy(name); err != nil {
			return err
		}
		c.name = name
		return nil
	})
}

// WithKey sets how calls are keyed for the limiter given to New (default:
// by peer address, see WithTrustedProxies and WithIPv6Prefix).
func WithKey(key KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if key == nil {
			return invalid("nil key func")
		}
		c.key = key
		return nil
	})
}

// WithLimiter adds a limiter asked about every call besides the one given
// to New, e.g. a per-method limit next to a per-client one. name names it
// (as for WithName); key keys calls for it (nil: by peer address). The
// limiters are asked in order, the one given to New first; see
// Interceptor for how a denial by one affects the others.
func WithLimiter(name string, limiter tierlimit.Limiter, key KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicy(name); err != nil {
			return err
		}
		if limiter == nil {
			return invalid("nil limiter for policy %q", name)
		}
		c.extra = append(c.extra, &rule{name: name, lim: limiter, key: key})
		return nil
	})
}

// WithMessageLimiter limits the messages a client sends on a stream:
// every message the server receives costs 1 of limiter, keyed by key with
// the stream's context (nil: by peer address). A denied message ends
// the stream's RecvMsg with the denial status, as a denied call's. name
// names the limiter (as for WithName). The stream's opening is charged by
// the other limiters, once.
func WithMessageLimiter(name string, limiter tierlimit.Limiter, key KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicy(name); err != nil {
			return err
		}
		if limiter == nil {
			return invalid("nil limiter for policy %q", name)
		}
		c.messages = append(c.messages, &rule{name: name, lim: limiter, key: key})
		return nil
	})
}

// WithTrustedProxies sets the proxies whose client metadata (see
// WithProxyHeader) is believed: CIDRs such as "10.0.0.0/8" or single
// addresses. By default no proxy is trusted and a call is keyed by its
// peer. With trusted proxies, a call whose peer is one of them is keyed by
// the right-most address of the metadata that is not a trusted proxy,
// looked for among its last 16 elements and 4 KiB: the rules of
// httplimit.WithTrustedProxies, so that what a client writes itself is
// never read.
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

// WithProxyHeader sets the metadata key trusted proxies name the client
// in: MetadataXForwardedFor (the default) or MetadataForwarded (RFC 7239
// syntax).
func WithProxyHeader(name string) Option {
	return optionFunc(func(c *config) error {
		switch strings.ToLower(name) {
		case MetadataXForwardedFor:
			c.forwarded = false
		case MetadataForwarded:
			c.forwarded = true
		default:
			return invalid("proxy metadata %q must be %q or %q", name, MetadataXForwardedFor, MetadataForwarded)
		}
		return nil
	})
}

// WithIPv6Prefix sets the prefix length, 1 to 128, an IPv6 client is keyed
// by (default DefaultIPv6Prefix).
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(c *config) error {
		if bits < 1 || bits > 128 {
			return invalid("IPv6 prefix /%d must be between /1 and /128", bits)
		}
		c.v6bits = bits
		return nil
	})
}

// WithCost sets the cost of a call (default 1), asked once per call when
// the first limiter is. A cost of 0 charges nothing; a cost a limiter can
// never admit (negative, or above its burst) is denied, with a pushback
// that tells clients not to retry.
func WithCost(cost func(ctx context.Context, fullMethod string) int64) Option {
	return optionFunc(func(c *config) error {
		if cost == nil {
			return invalid("nil cost func")
		}
		c.cost = cost
		return nil
	})
}

// WithShadow turns on shadow mode, for rolling out a limit: calls are
// decided and charged as when enforcing, but a denied call is served.
// Observe the limiters (WithDecisionFunc, package metrics) to see what
// enforcing would deny. Shadow mode refuses nothing, so that a mistake in
// what is being rolled out cannot refuse calls: a call with no valid
// limit or number of permits for its key, or with an empty key from a
// KeyFunc, is served too, and reported (WithErrorFunc, or logged) as a
// call enforcing would refuse; a blocked key's denials reach
// WithDecisionFunc as every denial does.
func WithShadow() Option {
	return optionFunc(func(c *config) error {
		c.shadow = true
		return nil
	})
}

// WithFailClosed refuses calls with codes.Unavailable when a limiter fails
// (a backend error). By default the interceptor fails open: the failing
// limiter is left out and the call goes on, since an outage of the
// limiter's store should not become an outage of the service. In shadow
// mode nothing is refused.
func WithFailClosed() Option {
	return optionFunc(func(c *config) error {
		c.failClosed = true
		return nil
	})
}

// WithErrorFunc sets a func told of every limiter error, on the call's
// goroutine, before the call is served or refused. The interceptor then
// passes errors to nothing else (without it, they are logged to
// WithLogger's logger at most once every 10 seconds).
func WithErrorFunc(f func(ctx context.Context, fullMethod string, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil error func")
		}
		c.onError = f
		return nil
	})
}

// WithDecisionFunc sets a func told of the decisions of the limiters (see
// DecisionFunc), in order, up to the first denial: the peeks after it are
// not told, so the last decision told is the one that settled the call.
func WithDecisionFunc(f DecisionFunc) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil decision func")
		}
		c.onDecision = f
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
