// Package tenanttest checks what every tier's limiter must do for many
// tenants, for the tests of local, remote and hybrid.
package tenanttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// Tenant is what every tier's limiter offers for many tenants.
type Tenant interface {
	AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error)
	WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
	AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error)
	LimitFor(key string) (tierlimit.Limit, error)
}

// BlockedResult is the Result of every call for a blocked key.
var BlockedResult = tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}

// CheckBlocked checks l's calls for key, which its LimitFunc blocks: each
// is denied with BlockedResult, peeks included, at once; WaitN with an
// error wrapping ErrWaitDeadline; a negative cost is ErrInvalidCost;
// LimitFor says Blocked; and an AllowAll of other (a key of a valid limit)
// and key charges other nothing. It makes 5 calls that report a decision
// (AllowN thrice, AllowAll, WaitN's one try).
func CheckBlocked(t *testing.T, l Tenant, key, other string) {
	t.Helper()
	ctx := context.Background()
	before, err := l.AllowN(ctx, other, 0)
	if err != nil {
		t.Fatalf("AllowN(%q, 0) = %v", other, err)
	}
	calls := []struct {
		name    string
		call    func() (tierlimit.Result, error)
		wantErr error
	}{
		{"AllowN(key, 1)", func() (tierlimit.Result, error) { return l.AllowN(ctx, key, 1) }, nil},
		{"AllowN(key, 0)", func() (tierlimit.Result, error) { return l.AllowN(ctx, key, 0) }, nil},
		{"AllowN(key, 1000)", func() (tierlimit.Result, error) { return l.AllowN(ctx, key, 1000) }, nil},
		{"AllowAll(other 1, key 1)", func() (tierlimit.Result, error) {
			return l.AllowAll(ctx, tierlimit.Take{Key: other, N: 1}, tierlimit.Take{Key: key, N: 1})
		}, nil},
		{"WaitN(key, 1)", func() (tierlimit.Result, error) { return l.WaitN(ctx, key, 1) }, tierlimit.ErrWaitDeadline},
		{"Settle(key, 4, 0)", func() (tierlimit.Result, error) { return l.Settle(ctx, key, 4, 0) }, nil},
	}
	for _, c := range calls {
		start := time.Now()
		got, err := c.call()
		if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) || got != BlockedResult {
			t.Errorf("%s = %+v, %v; want %+v, %v", c.name, got, err, BlockedResult, c.wantErr)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s took %v, want at once", c.name, took)
		}
	}
	if _, err := l.AllowN(ctx, key, -1); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("AllowN(key, -1) = %v, want ErrInvalidCost", err)
	}
	if got, err := l.LimitFor(key); got != tierlimit.Blocked || err != nil {
		t.Errorf("LimitFor(key) = %v, %v; want Blocked, nil", got, err)
	}
	if after, err := l.AllowN(ctx, other, 0); err != nil || after.Remaining != before.Remaining {
		t.Errorf("the other key of a blocked AllowAll: Remaining = %d (%v), want %d (not charged)",
			after.Remaining, err, before.Remaining)
	}
}

// Default is the default limit of the limiters CheckLimitFor checks.
var Default = tierlimit.PerSecond(5)

// Pro is Plans' limit for the key "pro".
var Pro = tierlimit.PerSecond(100)

// Plans is a LimitFunc: Pro for "pro", Blocked for "off", an invalid
// limit for "bad", the default for any other key.
func Plans(key string) tierlimit.Limit {
	switch key {
	case "pro":
		return Pro
	case "off":
		return tierlimit.Blocked
	case "bad":
		return tierlimit.PerSecond(0)
	}
	return tierlimit.Limit{}
}

// CheckLimitFor checks LimitFor of with, a limiter of Default with Plans,
// and without, one of Default without a LimitFunc: Plans' answer, the
// default for the zero Limit or no function, Blocked, ErrInvalidLimit for
// an invalid answer and ErrInvalidKey for a bad key.
func CheckLimitFor(t *testing.T, with, without Tenant) {
	t.Helper()
	tests := []struct {
		l       Tenant
		key     string
		want    tierlimit.Limit
		wantErr error
	}{
		{with, "pro", Pro, nil},
		{with, "free", Default, nil},
		{with, "off", tierlimit.Blocked, nil},
		{with, "bad", tierlimit.Limit{}, tierlimit.ErrInvalidLimit},
		{with, "", tierlimit.Limit{}, tierlimit.ErrInvalidKey},
		{without, "pro", Default, nil},
	}
	for _, tt := range tests {
		got, err := tt.l.LimitFor(tt.key)
		if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
			t.Errorf("LimitFor(%q) = %v, %v; want %v, %v", tt.key, got, err, tt.want, tt.wantErr)
		}
	}
}
