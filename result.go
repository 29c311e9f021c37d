package tierlimit

import (
	"context"
	"time"
)

// Source says which tier made a decision.
type Source uint8

// The tiers that decide.
const (
	SourceRemote   Source = iota // a Redis script decided
	SourceLocal                  // an in-process limiter or a held lease decided
	SourceBlocked                // a key known to be blocked was denied locally
	SourceFallback               // Redis was unreachable; the local fallback decided
)

var sourceNames = [...]string{"remote", "local", "blocked", "fallback"}

// String returns the source's lower-case name, e.g. "remote".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Result is the outcome of one decision.
type Result struct {
	Allowed    bool
	Limit      Limit         // the limit that decided (the most restrictive, when several apply)
	Remaining  int64         // tokens left for this key right after the decision (an estimate in hybrid)
	RetryAfter time.Duration // when denied: wait this long and the same request can succeed; 0 when allowed
	ResetAfter time.Duration // time until the key is back to full capacity
	Source     Source        // which tier decided

	// Uncharged is set by Settle only: the part of used − charged that the
	// key could not be charged, because its level reached the debt floor
	// (minus Burst) on the buckets, or its window reached Rate on the
	// windows, which keep no debt; 0 when it was all charged. It counts
	// whole tokens: the debt room is the key's whole tokens plus Burst.
	// With several limits on a key, it is the most any of them left
	// uncharged. local and every remote limiter report it; hybrid does not
	// yet (it is 0 there, and hybrid's Settle still refuses a used above
	// Burst). A Settle that leaves tokens uncharged is not an error:
	// the key has been charged all it can hold, and the caller may log,
	// bill or refuse the tenant's next request for the rest.
	Uncharged int64
}

// Limiter decides whether n events may happen now for key. n == 0 peeks
// without charging. A denial is a Result with Allowed false; an error means
// bad input, a cancelled ctx or a failing backend.
type Limiter interface {
	AllowN(ctx context.Context, key string, n int64) (Result, error)
}
