// Package logline spaces the log lines of a condition that may recur on
// every call (a failing limiter), so that a log is told without being
// flooded, and picks the logger a package logs to.
package logline

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// Every is a condition logged at most once per interval. The zero value
// has logged nothing. An Every is safe for concurrent use and must not be
// copied after first use.
type Every struct {
	last atomic.Int64 // unix ns of the last line
}

// Allow reports whether a line may be logged at now, at most one per
// every, and if so counts it: of callers racing, one wins.
func (e *Every) Allow(now time.Time, every time.Duration) bool {
	t := now.UnixNano()
	last := e.last.Load()
	return (last == 0 || t-last >= int64(every)) && e.last.CompareAndSwap(last, t)
}

// Or returns l, or slog.Default() when l is nil: the logger of a package
// whose WithLogger option was not given, read when a line is logged so
// that a later slog.SetDefault applies.
func Or(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.Default()
}
