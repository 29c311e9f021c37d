package permit

import (
	"context"
	"fmt"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Each tier's package has its own exported ConcurrencyOption type (its
// method sets the package's own Concurrency); these hold what the options
// and constructors of every tier check alike.

// Apply calls apply on each of opts in order and returns the first error;
// a nil option is an error wrapping tierlimit.ErrInvalidOption.
func Apply[O any](opts []O, apply func(O) error) error {
	for _, o := range opts {
		if any(o) == nil {
			return fmt.Errorf("%w: nil option", tierlimit.ErrInvalidOption)
		}
		if err := apply(o); err != nil {
			return err
		}
	}
	return nil
}

// CheckRedis checks the arguments of a NewConcurrency of a tier in Redis:
// n permits per key (tierlimit.CheckPermits), then a client (noClient: an
// error wrapping tierlimit.ErrInvalidOption).
func CheckRedis(n int64, noClient bool) error {
	if err := tierlimit.CheckPermits(n); err != nil {
		return err
	}
	if noClient {
		return fmt.Errorf("%w: nil redis client", tierlimit.ErrInvalidOption)
	}
	return nil
}

// Observer returns o.Permit, the function a WithPermitObserver option
// sets; a nil o is an error wrapping tierlimit.ErrInvalidOption.
func Observer(o *tierlimit.Observer) (func(tierlimit.PermitDecision), error) {
	if o == nil {
		return nil, fmt.Errorf("%w: nil observer", tierlimit.ErrInvalidOption)
	}
	return o.Permit, nil
}

// Func returns f, the function a WithPermitFunc option sets; a nil f is
// an error wrapping tierlimit.ErrInvalidOption.
func Func(f tierlimit.PermitFunc) (tierlimit.PermitFunc, error) {
	if f == nil {
		return nil, fmt.Errorf("%w: nil permit func", tierlimit.ErrInvalidOption)
	}
	return f, nil
}

// Check checks a call's input and returns key's number of permits (see
// Limit, def and fn): tierlimit.ErrClosed if the limiter is closed, then
// Ready's and Limit's errors, named pkg.
func Check(ctx context.Context, pkg string, closed bool, key string, def int64, fn tierlimit.PermitFunc) (int64, error) {
	if closed {
		return 0, tierlimit.ErrClosed
	}
	if err := Ready(ctx); err != nil {
		return 0, check.Named(pkg, err)
	}
	n, err := Limit(key, def, fn)
	return n, check.Named(pkg, err)
}
