package grpclimit

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// concurrencyPolicy names the concurrency limiter in a fail-closed status.
const concurrencyPolicy = "concurrency"

// WithConcurrency limits the calls in flight per key with c (see
// tierlimit.Concurrency), keyed as the limiter given to New is (WithKey,
// or the peer). A call the rate limiters admit asks c for a permit with
// TryAcquire and holds it until its handler returns (a stream: until it
// ends); a call that gets none is refused with codes.ResourceExhausted,
// without waiting. An error of c follows the error policy: reported, then
// the call goes on (fail open) or is refused with codes.Unavailable
// (WithFailClosed); an invalid number of permits for the key refuses the
// call. Under WithShadow no call is refused. Limit does not take permits:
// it has no end of the call to release them at.
func WithConcurrency(c tierlimit.Concurrency) Option {
	return optionFunc(func(cfg *config) error {
		if c == nil {
			return invalid("nil concurrency limiter")
		}
		cfg.conc = c
		return nil
	})
}

// permit returns a permit of the concurrency limiter for the call, the
// zero Permit (whose Release does nothing) if the call goes on without one
// (exempt, shadow, failing open), or the status error refusing the call.
func (in *Interceptor) permit(ctx context.Context, method string) (tierlimit.Permit, error) {
	var key string
	ok := true
	if k := in.rules[0].key; k != nil {
		key, ok = k(ctx, method)
	} else {
		key = in.clientIP(ctx)
	}
	if !ok || key == "" {
		return tierlimit.Permit{}, nil
	}
	p, ok, err := in.conc.TryAcquire(ctx, chain.ShortKey(key))
	switch {
	case err == nil && ok:
		return p, nil
	case err == nil, errors.Is(err, tierlimit.ErrInvalidLimit):
		if err != nil {
			in.report(ctx, method, fmt.Errorf("grpclimit: concurrency: call refused, no valid number of permits for its key: %w", err))
		}
		if in.shadow {
			return tierlimit.Permit{}, nil
		}
		return tierlimit.Permit{}, status.Error(codes.ResourceExhausted, "grpclimit: too many calls in flight")
	default:
		in.report(ctx, method, fmt.Errorf("grpclimit: concurrency: %w", err))
		if in.failClosed && !in.shadow {
			return tierlimit.Permit{}, unavailable(concurrencyPolicy)
		}
		return tierlimit.Permit{}, nil
	}
}
