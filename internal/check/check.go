// Package check holds the input rules every tier applies alike: a key's,
// and AllowAll's takes'. Their errors wrap tierlimit's sentinels and name no
// package: the public package that returns them names itself.
package check

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/tierlimit/tierlimit"
)

// Key reports whether key is acceptable: non-empty and at most
// tierlimit.MaxKeyLen bytes. Any bytes are allowed. Its error wraps
// tierlimit.ErrInvalidKey.
func Key(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", tierlimit.ErrInvalidKey)
	case len(key) > tierlimit.MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", tierlimit.ErrInvalidKey, len(key), tierlimit.MaxKeyLen)
	}
	return nil
}

// Takes checks takes for AllowAll and returns them with the takes of one
// key added up into one, in the order each key first appears. It returns
// an error wrapping tierlimit.ErrInvalidKey for a bad key, and
// tierlimit.ErrInvalidCost for no takes, a negative N, a sum that
// overflows, or more than tierlimit.MaxTakes distinct keys. It does not
// check a cost against a key's limit.
func Takes(takes []tierlimit.Take) ([]tierlimit.Take, error) {
	if len(takes) == 0 {
		return nil, fmt.Errorf("%w: AllowAll of no takes", tierlimit.ErrInvalidCost)
	}
	out := make([]tierlimit.Take, 0, len(takes))
	for _, t := range takes {
		if err := Key(t.Key); err != nil {
			return nil, err
		}
		if t.N < 0 {
			return nil, fmt.Errorf("%w: take of %d for key %q", tierlimit.ErrInvalidCost, t.N, t.Key)
		}
		i := 0
		for i < len(out) && out[i].Key != t.Key {
			i++
		}
		if i == len(out) {
			if len(out) == tierlimit.MaxTakes {
				return nil, fmt.Errorf("%w: AllowAll of more than %d keys", tierlimit.ErrInvalidCost, tierlimit.MaxTakes)
			}
			out = append(out, t)
			continue
		}
		if out[i].N > math.MaxInt64-t.N {
			return nil, fmt.Errorf("%w: takes for key %q add up past 2^63", tierlimit.ErrInvalidCost, t.Key)
		}
		out[i].N += t.N
	}
	return out, nil
}

// AtMost reports whether n is a cost an AllowAtMost may ask: from 1 to
// tierlimit.MaxRate, above a key's capacity too (it is granted what the
// key holds). Its error wraps tierlimit.ErrInvalidCost.
func AtMost(n int64) error {
	if n < 1 || n > tierlimit.MaxRate {
		return fmt.Errorf("%w: n %d must be between 1 and %d", tierlimit.ErrInvalidCost, n, int64(tierlimit.MaxRate))
	}
	return nil
}

// Named returns err as a caller of package pkg sees it: prefixed "pkg: "
// once (the form is "pkg: sentinel: detail"), unless it is nil, a
// context's error or tierlimit.ErrClosed, which are returned as they are
// for callers that compare them, or already begins with "pkg: ".
func Named(pkg string, err error) error {
	switch {
	case err == nil, err == context.Canceled, err == context.DeadlineExceeded, err == tierlimit.ErrClosed:
		return err
	case strings.HasPrefix(err.Error(), pkg+": "):
		return err
	}
	return fmt.Errorf("%s: %w", pkg, err)
}
