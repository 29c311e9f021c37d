package chain

import (
	"context"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

func TestShortKey(t *testing.T) {
	long := strings.Repeat("k", tierlimit.MaxKeyLen+1)
	for _, tc := range []struct{ key, want string }{
		{"a", "a"},
		{long[:tierlimit.MaxKeyLen], long[:tierlimit.MaxKeyLen]},
		{long, "sha256:"},
	} {
		got := ShortKey(tc.key)
		if tc.want == "sha256:" {
			if !strings.HasPrefix(got, tc.want) || len(got) != len("sha256:")+64 {
				t.Errorf("ShortKey(%d bytes) = %q, want a sha256: key", len(tc.key), got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("ShortKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// limiterOnly hides a limiter's Settle.
type limiterOnly struct{ tierlimit.Limiter }

func TestGiveBack(t *testing.T) {
	ctx := context.Background()
	lim, err := local.New(tierlimit.PerMinute(3))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if _, err := lim.AllowN(ctx, "k", 2); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := GiveBack(ctx, limiterOnly{lim}, "k", 2); ok || err != nil {
		t.Fatalf("GiveBack(no Settle) = %v, %v; want false, nil", ok, err)
	}
	if _, ok, _ := GiveBack(ctx, lim, "k", 0); ok {
		t.Fatalf("GiveBack(cost 0) = true, want false")
	}
	res, ok, err := GiveBack(ctx, lim, "k", 2)
	if !ok || err != nil || res.Remaining != 3 {
		t.Fatalf("GiveBack(2) = Remaining %d, %v, %v; want 3, true, nil", res.Remaining, ok, err)
	}
}
