// Command tierlimit-serve is an Envoy rate-limit service (RLS v3) on
// tierlimit's hybrid leases: see package serve and docs/serve.md.
//
// Usage:
//
//	tierlimit-serve [flags]
//
// Every flag may also be set in the environment as TIERLIMIT_SERVE_ and its
// name in capitals with '_' for '-' (TIERLIMIT_SERVE_REDIS_ADDRS); a flag on
// the command line wins. Without -redis-url or -redis-addrs it runs on an
// embedded Redis in this process (miniredis), for a first try only: its
// state dies with the process and no other replica shares it. Without
// -config it serves an example config, printed at start.
//
// It reloads the config when its files change (checked every
// -reload-interval) and on SIGHUP; a config it cannot load leaves the
// running one in effect, with a log line saying why. On SIGINT or SIGTERM
// it reports NOT_SERVING to health checks, finishes the requests in flight
// (at most -shutdown-timeout), and gives the tokens it holds back to Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Stderr, hup, nil)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tierlimit-serve:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the flags: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func newLogger(w io.Writer, format string) (*slog.Logger, error) {
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, nil)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, usagef("-log-format %q: want text or json", format)
}
