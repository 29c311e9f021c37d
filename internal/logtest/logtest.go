// Package logtest checks the WithLogger options of the library's
// packages: that what a package logs reaches the logger it is given and
// nothing reaches the default logger, and that without one the default
// logger has it.
package logtest

import (
	"bytes"
	"log/slog"
	"strings"
)

// TB is what Check needs of a *testing.T.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Check runs do twice with slog.Default() replaced by a logger of its
// own: once with logger, which do must pass to the WithLogger option of
// what it builds, and once with nil, when do must pass no WithLogger. Each
// time, the logger that should have the lines must hold want lines, each
// holding every string of has, and the other must hold nothing. Check
// restores slog.Default() before it returns; tests that call it must not
// run in parallel with others that log.
func Check(t TB, want int, has []string, do func(logger *slog.Logger)) {
	t.Helper()
	for _, withLogger := range []bool{true, false} {
		var own, global bytes.Buffer
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&global, nil)))
		var logger *slog.Logger
		got, quiet := &own, &global
		if withLogger {
			logger = slog.New(slog.NewTextHandler(&own, nil))
		} else {
			got, quiet = &global, &own
		}
		func() {
			defer slog.SetDefault(prev)
			do(logger)
		}()
		lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
		if got.Len() == 0 {
			lines = nil
		}
		if len(lines) != want {
			t.Errorf("WithLogger %v: %d lines logged, want %d:\n%s", withLogger, len(lines), want, got.String())
		}
		for _, l := range lines {
			for _, s := range has {
				if !strings.Contains(l, s) {
					t.Errorf("WithLogger %v: line %q lacks %q", withLogger, l, s)
				}
			}
		}
		if quiet.Len() != 0 {
			t.Errorf("WithLogger %v: the other logger got %q, want nothing", withLogger, quiet.String())
		}
	}
}
