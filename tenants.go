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

// Blocked is what a LimitFunc returns for a key that may not be used at all
// (a suspended tenant): every tier denies each of the key's calls without
// charging it, with Result.Limit Blocked, Source SourceBlocked and
// RetryAfter 0, which promises nothing about when the key opens again. It
// is not a valid Limit (Validate refuses it).
var Blocked = Limit{Burst: -1}

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
