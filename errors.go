package tierlimit

import (
	"errors"
	"strings"
)

// MaxKeyLen is the longest key, in bytes, that any limiter accepts.
const MaxKeyLen = 1024

// Errors returned by the limiters for bad input and misuse; test them with
// errors.Is. A denial is never an error.
var (
	// ErrInvalidLimit is returned by Limit.Validate for a limit outside the
	// ranges it documents (zero, negative, too large, or too slow to fill),
	// and by constructors for those and for a limit their algorithm cannot
	// hold (a burst on a window, a sliding log's rate above its memory bound).
	ErrInvalidLimit = errors.New("tierlimit: invalid limit")
	// ErrInvalidKey is returned by AllowN and Reset for an empty key or one
	// longer than MaxKeyLen.
	ErrInvalidKey = errors.New("tierlimit: invalid key")
	// ErrInvalidCost is returned by AllowN when n < 0 or n exceeds the burst:
	// such a request could never be admitted.
	ErrInvalidCost = errors.New("tierlimit: invalid cost")
	// ErrLimitLookup is returned, wrapping the lookup's own error, by a
	// call whose key's LimitLookup failed (see LimitLookup): the key was
	// neither charged nor decided. A caller, or an integration, must not
	// serve the request as if it had been admitted.
	ErrLimitLookup = errors.New("tierlimit: limit lookup failed")
	// ErrInvalidOption is returned by constructors for a bad option value or
	// a nil Redis client.
	ErrInvalidOption = errors.New("tierlimit: invalid option")
	// ErrClosed is returned by a limiter's methods after its Close.
	ErrClosed = errors.New("tierlimit: limiter closed")
	// ErrMisconfigured is returned when Redis refuses a limiter's commands
	// for how it is set up rather than because it is down or slow (see
	// Misconfigured). No tier turns it into a fallback decision: a
	// misconfiguration is not an outage to paper over.
	ErrMisconfigured = errors.New("tierlimit: redis refuses the limiter's commands (misconfigured)")
)

// Misconfigured reports whether err means that Redis cannot run a
// limiter's commands however healthy it is, so that waiting or falling
// back would only hide the problem:
//
//   - authentication: a wrong or missing password, in any of its replies
//     (NOAUTH, WRONGPASS, and the protocol error Redis sends an
//     unauthenticated client for a long command);
//   - permissions: NOPERM for a command (e.g. EVALSHA) or for a key
//     (no write on the key prefix);
//   - a renamed or disabled command (rename-command EVALSHA ""): an
//     unknown command or subcommand;
//   - READONLY: the client writes to a replica. go-redis retries this
//     reply and follows a failover, so one that reaches a limiter persists;
//   - OOM: a full server under maxmemory-policy noeviction.
//
// It also reports true for an error wrapping ErrMisconfigured.
func Misconfigured(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrMisconfigured) {
		return true
	}
	// The Redis reply may be wrapped, alone or with others (%w twice,
	// errors.Join): look at every error in the tree.
	for _, p := range misconfigPrefixes {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	switch e := err.(type) {
	case interface{ Unwrap() error }:
		return Misconfigured(e.Unwrap())
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if Misconfigured(inner) {
				return true
			}
		}
	}
	return false
}

// misconfigPrefixes begin the Redis error replies that Misconfigured
// recognises.
var misconfigPrefixes = []string{
	"NOAUTH ", "WRONGPASS ", "ERR AUTH ", "ERR Client sent AUTH", "ERR Protocol error: unauthenticated",
	"NOPERM ",
	"ERR unknown command ", "ERR unknown subcommand ",
	"READONLY ",
	"OOM ",
}
