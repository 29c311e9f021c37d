package remote

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// SlogLogger writes go-redis's own log lines (a dial that failed, a
// connection pool's trouble) to an slog.Logger, as warnings with the
// attribute logger=go-redis, instead of go-redis's unstructured lines on
// standard error. go-redis's logger is one per process, not per client:
// set it once, in main, before any client is made:
//
//	redis.SetLogger(remote.SlogLogger{Logger: logger})
//
// (The limiters of this module log to WithLogger's logger; these are the
// client's lines, which no limiter option can reach.) A SlogLogger is a
// small value, safe for concurrent use.
type SlogLogger struct {
	// Logger receives the lines; nil means slog.Default(), read at each
	// line.
	Logger *slog.Logger
}

// Printf logs one go-redis line at slog.LevelWarn: go-redis logs only
// what went wrong. It is go-redis's logging interface.
func (s SlogLogger) Printf(ctx context.Context, format string, v ...any) {
	l := s.Logger
	if l == nil {
		l = slog.Default()
	}
	if !l.Enabled(ctx, slog.LevelWarn) {
		return
	}
	l.LogAttrs(ctx, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)), slog.String("logger", "go-redis"))
}
