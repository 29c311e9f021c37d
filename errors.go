package tierlimit

import (
	"errors"
	"fmt"
	"strings"
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
	// ErrMisconfigured is returned when Redis refuses a limiter's commands
	// for how it is set up rather than because it is down: a wrong
	// password (WRONGPASS, NOAUTH) or a missing ACL permission (NOPERM),
	// e.g. for EVALSHA or SCRIPT. The hybrid tier returns it from AllowN
	// instead of deciding on its fallback: a misconfiguration is not an
	// outage to paper over.
	ErrMisconfigured = errors.New("tierlimit: redis refused the limiter's commands (auth or ACL)")
)

// Misconfigured reports whether err is Redis refusing a command for an
// authentication or permission reason (see ErrMisconfigured).
func Misconfigured(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrMisconfigured) {
		return true
	}
	// The Redis reply may be wrapped: look at every error in the chain.
	for e := err; e != nil; e = errors.Unwrap(e) {
		msg := e.Error()
		for _, p := range misconfigPrefixes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// misconfigPrefixes begin the Redis error replies that mean the client is
// not allowed, whatever the server's health.
var misconfigPrefixes = []string{"NOAUTH ", "WRONGPASS ", "NOPERM ", "ERR AUTH ", "ERR Client sent AUTH"}

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
