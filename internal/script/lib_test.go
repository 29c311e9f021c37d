package script

import (
	"context"
	"io/fs"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/lua"
)

// muldivCase is a call of lib.lua's muldiv within its documented range.
type muldivCase struct{ a, b, c, d int64 }

// muldivCases returns edge cases and n random ones, each drawn so that the
// quotient stays below 2^53 while the product a·b passes it.
func muldivCases(n int) []muldivCase {
	const two51, two52, two53 = 1 << 51, 1 << 52, 1 << 53
	cases := []muldivCase{
		{0, 0, 0, 1}, {1, 1, 0, 1}, {two53 - 1, 1, two52 - 1, two51},
		{two52, 1, 0, 1}, {two52 + 1, 3, 7, 5}, {86_399_999_999, 1_000_003, 86_399_999_999, 86_400_000_000},
		{333_334, 86_400_000_000, 86_400_000_000 + 1_000_002, 1_000_003},
		{two52 - 1, two52 - 1, two52 - 1, two51}, // q just below 2^53
	}
	r := rand.New(rand.NewPCG(1, 2))
	for len(cases) < n {
		d := 1 + r.Int64N(two51)
		a := r.Int64N(two53)
		// b up to the largest that keeps the quotient below 2^52.
		bmax := new(big.Int).Quo(new(big.Int).Mul(big.NewInt(two52), big.NewInt(d)), big.NewInt(max(a, 1)))
		if !bmax.IsInt64() || bmax.Int64() > two53-1 {
			bmax.SetInt64(two53 - 1)
		}
		b := r.Int64N(bmax.Int64() + 1)
		cases = append(cases, muldivCase{a, b, r.Int64N(two52), d})
	}
	return cases
}

// checkMuldiv runs muldiv on rdb for each case and checks q and r against
// big integers.
func checkMuldiv(t *testing.T, rdb redis.UniversalClient, cases []muldivCase) {
	t.Helper()
	lib, err := fs.ReadFile(lua.Files, "lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	s := redis.NewScript(string(lib) + "\nlocal q, r = muldiv(tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))\n" +
		"return {string.format('%d', q), string.format('%d', r)}")
	ctx := context.Background()
	for _, c := range cases {
		got, err := s.Run(ctx, rdb, nil, 0, c.a, c.b, c.c, c.d).StringSlice()
		if err != nil {
			t.Fatalf("muldiv(%d, %d, %d, %d): %v", c.a, c.b, c.c, c.d, err)
		}
		x := new(big.Int).Mul(big.NewInt(c.a), big.NewInt(c.b))
		x.Add(x, big.NewInt(c.c))
		q, r := new(big.Int).QuoRem(x, big.NewInt(c.d), new(big.Int))
		if got[0] != q.String() || got[1] != r.String() {
			t.Errorf("muldiv(%d, %d, %d, %d) = %s, %s; want %s, %s", c.a, c.b, c.c, c.d, got[0], got[1], q, r)
		}
	}
}

// TestMuldiv checks lib.lua's muldiv on a real Redis (Lua 5.1) and on
// miniredis (gopher-lua): exact where float64 would round the product.
func TestMuldiv(t *testing.T) {
	cases := muldivCases(2000)
	t.Run("redis", func(t *testing.T) { checkMuldiv(t, redistest.Start(t).Client(t), cases) })
	t.Run("miniredis", func(t *testing.T) {
		_, rdb := redistest.Mini(t)
		checkMuldiv(t, rdb, cases)
	})
}
