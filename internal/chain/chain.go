// Package chain holds what the middlewares (httplimit, grpclimit) share
// to ask several limiters about one call in order: a call refused by one
// of them is given back to the ones that admitted it, so that it charges
// none; and keys too long for a limiter are shortened rather than refused.
package chain

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/tierlimit/tierlimit"
)

// Settler is a limiter that can give a charge back: every tier's
// (local.Limiter, the remote limiters, hybrid.Limiter).
type Settler interface {
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
}

// GiveBack gives cost back to lim for key, when lim is a Settler and cost
// is positive, and returns what the key holds then. ok is false when
// there was nothing to give back or lim cannot; a limiter without Settle
// keeps the charge.
func GiveBack(ctx context.Context, lim tierlimit.Limiter, key string, cost int64) (res tierlimit.Result, ok bool, err error) {
	s, can := lim.(Settler)
	if !can || cost <= 0 {
		return tierlimit.Result{}, false, nil
	}
	res, err = s.Settle(ctx, key, cost, 0)
	return res, err == nil, err
}

// ShortKey returns key, or its SHA-256 when it is longer than
// tierlimit.MaxKeyLen, so that no key is refused for its length.
func ShortKey(key string) string {
	if len(key) <= tierlimit.MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// MaxPolicyLen bounds the names of the limiters a middleware asks, so
// that the fields and messages that carry them stay short.
const MaxPolicyLen = 64

// CheckPolicy reports whether name may name a limiter of a middleware: 1
// to MaxPolicyLen printable ASCII characters, the alphabet of a
// structured-field string. The error wraps tierlimit.ErrInvalidOption and
// starts with pkg.
func CheckPolicy(pkg, name string) error {
	if name == "" || len(name) > MaxPolicyLen {
		return fmt.Errorf("%w: %s: policy name %q must be 1 to %d characters", tierlimit.ErrInvalidOption, pkg, name, MaxPolicyLen)
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] > 0x7e {
			return fmt.Errorf("%w: %s: policy name %q must be printable ASCII", tierlimit.ErrInvalidOption, pkg, name)
		}
	}
	return nil
}
