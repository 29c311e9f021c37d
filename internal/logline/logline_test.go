package logline

import (
	"log/slog"
	"testing"
	"time"
)

func TestEvery(t *testing.T) {
	var e Every
	t0 := time.Unix(1_000_000, 0)
	for i, tc := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},
		{time.Second, false},
		{10*time.Second - 1, false},
		{10 * time.Second, true},
		{15 * time.Second, false},
		{20 * time.Second, true},
	} {
		if got := e.Allow(t0.Add(tc.at), 10*time.Second); got != tc.want {
			t.Errorf("step %d: Allow(t0+%v) = %v, want %v", i, tc.at, got, tc.want)
		}
	}
}

func TestOr(t *testing.T) {
	l := slog.New(slog.DiscardHandler)
	if got := Or(l); got != l {
		t.Errorf("Or(l) = %p, want l %p", got, l)
	}
	if got := Or(nil); got != slog.Default() {
		t.Errorf("Or(nil) = %p, want slog.Default() %p", got, slog.Default())
	}
}
