package tierlimit

import (
	"errors"
	"fmt"
)

// MaxKeyLen is the longest key, in bytes, that any limiter accepts.
const MaxKeyLen = 1024

// Errors returned by the limiters for bad input and misuse; test them with
// errors.Is. A denial is never an error.
var (
	// ErrInvalidLimit is returned by constructors and Limit.Validate for a
	// limit that is zero, negative, or would overflow the exact arithmetic.
	ErrInvalidLimit = errors.New("tierlimit: invalid limit")
	// ErrInvalidKey is returned by AllowN and Reset for an empty key or one
	// longer than MaxKeyLen.
	ErrInvalidKey = errors.New("tierlimit: invalid key")
	// ErrInvalidCost is returned by AllowN when n < 0 or n exceeds the burst:
	// such a request could never be admitted.
	ErrInvalidCost = errors.New("tierlimit: invalid cost")
	// ErrInvalidOption is returned by constructors for a bad option value or
	// a nil Redis client.
	ErrInvalidOption = errors.New("tierlimit: invalid option")
	// ErrClosed is returned by a limiter's methods after its Close.
	ErrClosed = errors.New("tierlimit: limiter closed")
)

// CheckKey reports whether key is acceptable: non-empty and at most
// MaxKeyLen bytes. Any bytes are allowed. Its error wraps ErrInvalidKey.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}
