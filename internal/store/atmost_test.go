package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestAllowAtMostLedger: a Limiter with a lease ledger (Config.Hold)
// refuses AllowAtMost, as it refuses AllowAll and Settle: its script
// decides by claims.
func TestAllowAtMostLedger(t *testing.T) {
	_, rdb := redistest.Mini(t)
	tb, err := New(rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g, r, err := tb.AllowAtMost(context.Background(), "k", 3); !errors.Is(err, tierlimit.ErrInvalidOption) || g != 0 || r != (tierlimit.Result{}) {
		t.Errorf("AllowAtMost on a ledger = %d, %+v, %v; want 0, ErrInvalidOption", g, r, err)
	}
}
