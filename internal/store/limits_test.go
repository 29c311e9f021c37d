package store

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLeaseLargeLimits runs the lease protocol, with and without the
// ledger (tokenbucket.lua and ledger.lua), on limits whose level in units
// passes 2^53: a claim and a refund move whole tokens and keep the part of
// a token refilled, and waits stay exact to the µs.
func TestLeaseLargeLimits(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	for _, limit := range []tierlimit.Limit{
		tierlimit.PerDay(1_000_003),
		tierlimit.Limit{Rate: 1_000_003, Period: 30 * 24 * time.Hour},
		tierlimit.PerSecond(1_000_000_000_000),
		tierlimit.PerSecond(125_000_000).WithBurst(1_000_000_000_000),
	} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			checkOn(t, rdb, func(t *testing.T, b backend) {
				cfg := b.cfg
				cfg.Hold = time.Hour
				cfg.Prefix = "large:"
				leaseLargeLimit(t, b, limit, cfg)
			})
		})
	}
}

func leaseLargeLimit(t *testing.T, b backend, limit tierlimit.Limit, cfg Config) {
	ctx := context.Background()
	tb, err := New(b.rdb, TokenBucket, limit, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	// wait is ceil(n·Period/Rate) µs, tokens floor(d·Rate/Period).
	wait := func(n int64) time.Duration {
		x := new(big.Int).Mul(big.NewInt(n), big.NewInt(limit.PeriodMicros()))
		x.Add(x, big.NewInt(limit.Rate-1))
		return time.Duration(x.Quo(x, big.NewInt(limit.Rate)).Int64()) * time.Microsecond
	}
	tokens := func(d time.Duration) int64 {
		x := new(big.Int).Mul(big.NewInt(d.Microseconds()), big.NewInt(limit.Rate))
		return x.Quo(x, big.NewInt(limit.PeriodMicros())).Int64()
	}
	claim := Claim{Holder: "a", Gen: 1}
	// Numbered after the claim, whose tokens it received.
	refund := Refund{Key: "k", Holder: "a", Gen: 2, Received: limit.Capacity() / 2}
	c := limit.Capacity()
	h := c / 2
	b.set(t0)
	claim.Min, claim.Want = h, h
	if n, res, err := tb.Lease(ctx, "k", claim); err != nil || n != h || res.Remaining != c-h {
		t.Fatalf("Lease(%d) full = %d, remaining %d, %v; want %d, %d", h, n, res.Remaining, err, h, c-h)
	}
	if res, err := tb.AllowN(ctx, "k", c-h); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("AllowN(%d) = %+v, %v; want allowed, 0 left", c-h, res, err)
	}
	if res, _ := tb.AllowN(ctx, "k", 1); res.Allowed || res.RetryAfter != wait(1) {
		t.Errorf("AllowN(1) drained = %v, RetryAfter %v; want false, %v", res.Allowed, res.RetryAfter, wait(1))
	}
	// An odd step, below what refills the h tokens the lease holds (the
	// ledger's ceiling).
	d := wait(h/3) + 777*time.Microsecond
	b.set(t0.Add(d))
	if res, _ := tb.AllowN(ctx, "k", 0); res.Remaining != tokens(d) {
		t.Errorf("AllowN(0) %v after draining = %d left, want %d", d, res.Remaining, tokens(d))
	}
	// The lease's tokens come back whole; the part of a token refilled
	// stays: one token more is exactly as far as before the refund.
	// Given back as spent tokens, which the bucket takes whatever its
	// ledger holds: the lease's record may have passed its deadline (a
	// hold shorter than d), and its own tokens are back already.
	refund.Spent = h
	if _, err := tb.Refund(ctx, refund); err != nil {
		t.Fatal(err)
	}
	got := tokens(d) + h
	if res, _ := tb.AllowN(ctx, "k", got+1); res.Allowed || res.Remaining != got || res.RetryAfter != wait(tokens(d)+1)-d {
		t.Errorf("AllowN(%d) after refunding %d = %v, %d left, RetryAfter %v; want false, %d, %v",
			got+1, h, res.Allowed, res.Remaining, res.RetryAfter, got, wait(tokens(d)+1)-d)
	}
}
