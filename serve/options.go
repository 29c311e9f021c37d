package serve

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// Option configures a Server.
type Option interface {
	apply(*options) error
}

type options struct {
	logger     *slog.Logger
	shadow     bool
	headers    *HeaderNames
	registerer prometheus.Registerer
	hybridOpts []hybrid.Option
	localOpts  []local.Option
	remoteOpts []remote.Option
}

type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

// WithLogger sets the logger of the server and its limiters (default
// slog.Default()). A nil l is an error.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: serve: nil logger", tierlimit.ErrInvalidOption)
		}
		o.logger = l
		o.hybridOpts = append(o.hybridOpts, hybrid.WithLogger(l))
		o.remoteOpts = append(o.remoteOpts, remote.WithLogger(l))
		return nil
	})
}

// WithShadowMode makes every response OK, whatever its descriptors'
// statuses (envoyproxy/ratelimit's SHADOW_MODE): decisions are made, counted
// and reported in the statuses, and never enforced.
func WithShadowMode() Option {
	return optionFunc(func(o *options) error { o.shadow = true; return nil })
}

// WithResponseHeaders makes responses carry headers for Envoy to add to
// the client's response (envoyproxy/ratelimit's
// LIMIT_RESPONSE_HEADERS_ENABLED): the limit, remaining and reset in seconds
// of the most restrictive descriptor. Empty names take the defaults
// (DefaultLimitHeader, DefaultRemainingHeader, DefaultResetHeader). Without
// this option, responses carry no headers.
func WithResponseHeaders(names HeaderNames) Option {
	return optionFunc(func(o *options) error {
		if names.Limit == "" {
			names.Limit = DefaultLimitHeader
		}
		if names.Remaining == "" {
			names.Remaining = DefaultRemainingHeader
		}
		if names.Reset == "" {
			names.Reset = DefaultResetHeader
		}
		o.headers = &names
		return nil
	})
}

// WithRegisterer registers the server's metrics, and those of its hybrid
// limiter (package metrics, under limiter="serve"), with r. Without it the
// server exports no metrics.
func WithRegisterer(r prometheus.Registerer) Option {
	return optionFunc(func(o *options) error {
		if r == nil {
			return fmt.Errorf("%w: serve: nil registerer", tierlimit.ErrInvalidOption)
		}
		o.registerer = r
		return nil
	})
}

// WithHybridOptions passes opts to hybrid.New, after the server's own
// (WithLimitFunc, and WithLogger and WithObserver when set).
func WithHybridOptions(opts ...hybrid.Option) Option {
	return optionFunc(func(o *options) error { o.hybridOpts = append(o.hybridOpts, opts...); return nil })
}

// WithRemoteOptions passes opts to the constructors of the remote limiters.
func WithRemoteOptions(opts ...remote.Option) Option {
	return optionFunc(func(o *options) error { o.remoteOpts = append(o.remoteOpts, opts...); return nil })
}

// WithLocalOptions passes opts to local.New.
func WithLocalOptions(opts ...local.Option) Option {
	return optionFunc(func(o *options) error { o.localOpts = append(o.localOpts, opts...); return nil })
}
