package tierlimit

import (
	"errors"
)

// LimitFunc returns the Limit of a key, for limiters that serve keys of
// many limits (a tenant's plan, a customer's negotiated quota). The zero
// Limit means the limiter's default, the one passed to its constructor.
//
// A limiter calls it when it needs a key's limit (hybrid at most once per
// key per lease TTL; local and remote on every decision): it must be safe
// for concurrent use and must not call the limiter. When its answer for a
// key changes, the key keeps its state (its tokens, capped at the new
// Burst), as x/time/rate's SetLimit does. An answer that is neither
// Blocked nor a valid Limit is an error wrapping ErrInvalidLimit for the
// call that asked, which every integration of this module refuses.
type LimitFunc func(key string) Limit

// LimitLookup returns the Limit of a key as a LimitFunc does (the zero
// Limit: the limiter's default; Blocked: the key may not be used), or an
// error when it cannot tell: the plan store is down, the lookup timed out.
// Give one to a limiter with its package's WithLimitLookup.
//
// A limiter treats a failed lookup alike on every tier: the call that
// asked returns an error wrapping both ErrLimitLookup and the lookup's
// error, the key is neither charged nor decided, and no default is
// applied in its place: a lookup failure fails closed. A limiter built
// with its package's WithLookupFailOpen decides the key under its default
// limit instead. The integrations of this module (httplimit, grpclimit)
// refuse a call whose lookup failed under every error policy, as they
// refuse an invalid limit.
//
// A limiter asks it when it would ask a LimitFunc, and its answer follows
// the same rules; a failure is not remembered (the next call asks again),
// a default applied by WithLookupFailOpen is, as an answer.
type LimitLookup func(key string) (Limit, error)

// Blocked is what a LimitFunc returns for a key that may not be used at all
// (a suspended tenant): every tier denies each of the key's calls without
// charging it, with Result.Limit Blocked, Source SourceBlocked and
// RetryAfter 0, which promises nothing about when the key opens again. It
// is not a valid Limit (Validate refuses it).
//
// The limiters recognise a blocked limit by its value (Limit.IsBlocked),
// never by reading this variable: test a Result with res.Limit.IsBlocked().
var Blocked = Limit{Burst: -1}

// IsBlocked reports whether l is the Blocked limit: a Burst of -1 and no
// Rate or Period.
func (l Limit) IsBlocked() bool { return l == Limit{Burst: -1} }

// Take is one key's part of an all-or-nothing decision (AllowAll on every
// tier): charge N events to Key.
type Take struct {
	Key string
	N   int64
}

// ErrWaitDeadline is returned by WaitN, on every tier, when the wait for
// admission cannot end before the context's deadline: it returns at once
// rather than sleep into a certain failure.
var ErrWaitDeadline = errors.New("tierlimit: wait would exceed the context's deadline")

// MaxTakes bounds the number of distinct keys one AllowAll decides.
const MaxTakes = 64
