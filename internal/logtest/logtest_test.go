package logtest

import (
	"fmt"
	"log/slog"
	"testing"
)

// recorder is a TB that keeps the errors.
type recorder struct{ errs []string }

func (*recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheck checks Check on a package that logs right, and on ones that
// log to the default logger despite the option, too much, or not at all.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		do       func(l *slog.Logger)
		wantErrs int
	}{
		{"right", func(l *slog.Logger) {
			if l == nil {
				l = slog.Default()
			}
			l.Info("hello", "n", 1)
		}, 0},
		{"always the default", func(*slog.Logger) { slog.Info("hello", "n", 1) }, 2},
		{"two lines", func(l *slog.Logger) {
			if l == nil {
				l = slog.Default()
			}
			l.Info("hello", "n", 1)
			l.Info("hello", "n", 1)
		}, 2},
		{"silent", func(*slog.Logger) {}, 2},
		{"wrong line", func(l *slog.Logger) {
			if l == nil {
				l = slog.Default()
			}
			l.Info("bye")
		}, 4},
	} {
		var r recorder
		Check(&r, 1, []string{"msg=hello", "n=1"}, tc.do)
		if len(r.errs) != tc.wantErrs {
			t.Errorf("%s: Check reported %d errors %q, want %d", tc.name, len(r.errs), r.errs, tc.wantErrs)
		}
	}
}
