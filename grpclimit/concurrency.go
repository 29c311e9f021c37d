package grpclimit

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"google.golang.org/grpc"
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
// without waiting, whose message says the concurrency limit refused it and
// which carries no RetryInfo and no pushback: nothing says when a call in
// flight ends, so a retrying client backs off by its own policy. An error
// of c follows the error policy: reported, then the call goes on (fail
// open) or is refused with codes.Unavailable (WithFailClosed); an invalid
// number of permits for the key (tierlimit.ErrInvalidLimit, from a
// PermitFunc) refuses the call under every policy, with
// codes.ResourceExhausted and a pushback of -1. Under WithShadow no call
// is refused. Limit does not take permits: it has no end of the call to
// release them at.
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
// ss, when not nil, is the stream whose trailer a refusal sets.
func (in *Interceptor) permit(ctx context.Context, method string, ss grpc.ServerStream) (tierlimit.Permit, error) {
	var key string
	ok := true
	if k := in.rules[0].key; k != nil {
		key, ok = k(ctx, method)
		if ok && key == "" {
			in.report(ctx, method, fmt.Errorf("grpclimit: concurrency: call %s: its KeyFunc returned an empty key for a limited call: %w",
				in.verdict(codes.Internal), tierlimit.ErrInvalidKey), false)
			if in.shadow {
				return tierlimit.Permit{}, nil
			}
			setTrailer(ctx, ss, noRetry)
			return tierlimit.Permit{}, status.Error(codes.Internal, "grpclimit: the call has no key to be limited by")
		}
	} else {
		key = in.clientIP(ctx)
		ok = key != ""
	}
	if !ok {
		return tierlimit.Permit{}, nil
	}
	p, ok, err := in.conc.TryAcquire(ctx, chain.ShortKey(key))
	switch {
	case err == nil && ok:
		return p, nil
	case err == nil:
		if in.shadow {
			return tierlimit.Permit{}, nil
		}
		// No RetryInfo and no pushback: nothing says when a call in
		// flight ends, so a retrying client backs off by its own policy.
		return tierlimit.Permit{}, status.Error(codes.ResourceExhausted, "grpclimit: too many calls in flight for the key (concurrency limit)")
	case errors.Is(err, tierlimit.ErrInvalidLimit):
		in.report(ctx, method, fmt.Errorf("grpclimit: concurrency: call %s, the limiter has no valid number of permits for its key: %w",
			in.verdict(codes.ResourceExhausted), err), false)
		if in.shadow {
			return tierlimit.Permit{}, nil
		}
		setTrailer(ctx, ss, noRetry)
		return tierlimit.Permit{}, status.Error(codes.ResourceExhausted, "grpclimit: refused by the concurrency limit: no valid number of permits for the call's key")
	default:
		in.report(ctx, method, fmt.Errorf("grpclimit: concurrency: %w", err), true)
		if in.failClosed && !in.shadow {
			return tierlimit.Permit{}, unavailable(concurrencyPolicy)
		}
		return tierlimit.Permit{}, nil
	}
}
