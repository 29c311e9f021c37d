package check

import (
	"fmt"

	"github.com/tierlimit/tierlimit"
)

// Lookup is how a limiter finds a key's own limit, on every tier alike:
// WithLimitFunc's function or WithLimitLookup's, and what a failed lookup
// means. The zero Lookup has no function: every key has the default.
type Lookup struct {
	fn   tierlimit.LimitLookup
	open bool // WithLookupFailOpen: a failed lookup is the default
}

// NewLookup returns the Lookup of a limiter's options: f
// (WithLimitFunc), lookup (WithLimitLookup) or neither, and open
// (WithLookupFailOpen). Its error wraps tierlimit.ErrInvalidOption for
// both functions, or open without a lookup (a LimitFunc cannot fail).
func NewLookup(f tierlimit.LimitFunc, lookup tierlimit.LimitLookup, open bool) (Lookup, error) {
	switch {
	case f != nil && lookup != nil:
		return Lookup{}, fmt.Errorf("%w: WithLimitFunc and WithLimitLookup both given: choose one", tierlimit.ErrInvalidOption)
	case open && lookup == nil:
		return Lookup{}, fmt.Errorf("%w: WithLookupFailOpen without WithLimitLookup", tierlimit.ErrInvalidOption)
	case f != nil:
		return Lookup{fn: func(key string) (tierlimit.Limit, error) { return f(key), nil }}, nil
	}
	return Lookup{fn: lookup, open: open}, nil
}

// Set reports whether lk has a function.
func (lk Lookup) Set() bool { return lk.fn != nil }

// Limit returns key's answer: the function's (the zero Limit for the
// default), or, when it fails, the zero Limit if lk fails open and else
// an error wrapping tierlimit.ErrLimitLookup and the function's error.
// lk must be Set.
func (lk Lookup) Limit(key string) (tierlimit.Limit, error) {
	limit, err := lk.fn(key)
	if err == nil {
		return limit, nil
	}
	if lk.open {
		return tierlimit.Limit{}, nil
	}
	return tierlimit.Limit{}, fmt.Errorf("%w for key %q: %w", tierlimit.ErrLimitLookup, key, err)
}
