package local

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestBlocked: a key the LimitFunc blocks is denied by every call, peeks
// included, with the blocked Result, and never charged: a refused AllowAll
// charges its other keys nothing, WaitN returns at once with
// ErrWaitDeadline, Settle changes nothing, and the key's tokens are as
// they were when the function opens it again.
func TestBlocked(t *testing.T) {
	p := newPlans("t", tierlimit.PerSecond(10))
	l, _ := newTest(t, tierlimit.PerSecond(5), WithLimitFunc(p.limit))
	ctx := context.Background()
	if r, err := l.AllowN(ctx, "t", 4); err != nil || !r.Allowed {
		t.Fatalf("AllowN(t, 4) = %+v, %v; want allowed", r, err)
	}
	p.set("t", tierlimit.Blocked)
	want := tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}
	calls := []struct {
		name    string
		call    func() (tierlimit.Result, error)
		wantErr error
	}{
		{"AllowN(t, 1)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 1) }, nil},
		{"AllowN(t, 0)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 0) }, nil},
		{"AllowN(t, 1000)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 1000) }, nil},
		{"AllowAll(ok 1, t 1)", func() (tierlimit.Result, error) {
			return l.AllowAll(ctx, tierlimit.Take{Key: "ok", N: 1}, tierlimit.Take{Key: "t", N: 1})
		}, nil},
		{"WaitN(t, 1)", func() (tierlimit.Result, error) { return l.WaitN(ctx, "t", 1) }, tierlimit.ErrWaitDeadline},
		{"Settle(t, 4, 0)", func() (tierlimit.Result, error) { return l.Settle(ctx, "t", 4, 0) }, nil},
	}
	for _, c := range calls {
		start := time.Now()
		got, err := c.call()
		if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) || got != want {
			t.Errorf("%s = %+v, %v; want %+v, %v", c.name, got, err, want, c.wantErr)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s took %v, want at once", c.name, took)
		}
	}
	for _, n := range []int64{-1} {
		if _, err := l.AllowN(ctx, "t", n); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("AllowN(t, %d) of a blocked key = %v, want ErrInvalidCost", n, err)
		}
	}
	if got, err := l.LimitFor("t"); got != tierlimit.Blocked || err != nil {
		t.Errorf("LimitFor(t) = %v, %v; want Blocked, nil", got, err)
	}
	p.set("t", tierlimit.PerSecond(10))
	if r, _ := l.AllowN(ctx, "t", 0); r.Remaining != 6 {
		t.Errorf("unblocked: Remaining = %d, want 6 (4 taken before the block, nothing since)", r.Remaining)
	}
	if r, _ := l.AllowN(ctx, "ok", 0); r.Remaining != 5 {
		t.Errorf("the other key of a blocked AllowAll: Remaining = %d, want 5 (not charged)", r.Remaining)
	}
}

// TestLimitFor: the function's answer, the default for the zero Limit or
// no function, Blocked, and ErrInvalidLimit for an invalid answer.
func TestLimitFor(t *testing.T) {
	def := tierlimit.PerSecond(5)
	p := newPlans("pro", tierlimit.PerSecond(100).WithBurst(300), "off", tierlimit.Blocked,
		"bad", tierlimit.PerSecond(0))
	with, _ := newTest(t, def, WithLimitFunc(p.limit))
	without, _ := newTest(t, def)
	tests := []struct {
		l       *Limiter
		key     string
		want    tierlimit.Limit
		wantErr error
	}{
		{with, "pro", tierlimit.PerSecond(100).WithBurst(300), nil},
		{with, "free", def, nil},
		{with, "off", tierlimit.Blocked, nil},
		{with, "bad", tierlimit.Limit{}, tierlimit.ErrInvalidLimit},
		{with, "", tierlimit.Limit{}, tierlimit.ErrInvalidKey},
		{without, "pro", def, nil},
	}
	for _, tt := range tests {
		got, err := tt.l.LimitFor(tt.key)
		if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
			t.Errorf("LimitFor(%q) = %v, %v; want %v, %v", tt.key, got, err, tt.want, tt.wantErr)
		}
	}
}
