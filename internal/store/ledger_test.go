package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

func TestLeaseLedgerMiniredis(t *testing.T) { testLeaseLedger(t, miniBackend(t)) }

func TestLeaseLedgerRedis(t *testing.T) { checkOn(t, redistest.Start(t).Client(t), testLeaseLedger) }

// testLeaseLedger steps a bucket of 10 tokens at 10/s, whose holders hold
// their tokens 1 s after a grant, through claims, refunds and deadlines,
// checking the level (a peek's Remaining) after each step. A bucket without
// the ledger would be back at 10 within a second of any claim.
func testLeaseLedger(t *testing.T, b backend) {
	ctx := context.Background()
	cfg := b.cfg
	cfg.Hold = time.Second
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	received := map[string]int64{} // per holder, what its replies granted
	claim := func(holder string, gen, held, want int64) func() (int64, error) {
		return func() (int64, error) {
			n, _, err := tb.Lease(ctx, "k", Claim{Min: min(1, want), Want: want, Holder: holder, Gen: gen, Held: held, Received: received[holder]})
			received[holder] += n
			return n, err
		}
	}
	refund := func(holder string, gen, n int64) func() (int64, error) {
		return func() (int64, error) {
			_, err := tb.Refund(ctx, Refund{Key: "k", N: n, Holder: holder, Gen: gen, Received: received[holder]})
			return 0, err
		}
	}
	steps := []struct {
		name    string
		at      time.Time
		op      func() (int64, error) // nil: peek only
		granted int64
		level   int64
	}{
		{"a claims 4", ms(0), claim("a", 1, 0, 4), 4, 6},
		// The bucket refills up to 10 - 4 only: a holds 4.
		{"ceiling while a holds 4", ms(500), nil, 0, 6},
		// a says it holds 1: the ceiling rises to 9, the level does not jump.
		{"a reports 1 held", ms(500), claim("a", 2, 1, 0), 0, 6},
		{"refill under the new ceiling", ms(700), nil, 0, 8},
		{"at the ceiling", ms(900), nil, 0, 9},
		// a's deadline (1 s after its grant) passed at 1000 ms: the level
		// grows from there at 10/s, it does not jump to 10.
		{"a's deadline passed", ms(1050), nil, 0, 9},
		{"full again", ms(1200), nil, 0, 10},
		{"b claims 5", ms(1200), claim("b", 1, 0, 5), 5, 5},
		{"b refunds 5", ms(1200), refund("b", 2, 5), 0, 10},
		{"c claims 3", ms(1200), claim("c", 1, 0, 3), 3, 7},
		{"c claims 2 more", ms(1200), claim("c", 2, 3, 2), 2, 5},
		// A refund made before c's second claim, run after it, leaves c's
		// entry (5) and gives nothing back: the ceiling is 10 - 5.
		{"c's stale refund", ms(1200), refund("c", 1, 3), 0, 5},
		{"ceiling while c holds 5", ms(2000), nil, 0, 5},
		// Someone else's AllowN admits from the level only.
		{"allow 2", ms(2000), func() (int64, error) {
			r, err := tb.AllowN(ctx, "k", 2)
			if !r.Allowed {
				return 0, errors.New("AllowN(2) denied")
			}
			return 2, err
		}, 2, 3},
		{"c's deadline passed", ms(2300), nil, 0, 6}, // 3 at 2000 ms, the ceiling 5 at 2200, then +1
		{"full at last", ms(3000), nil, 0, 10},
		{"d claims 4", ms(3000), claim("d", 1, 0, 4), 4, 6},
		{"d refunds 4", ms(3000), refund("d", 3, 4), 0, 10},
		// d's claim 2, sent before its refund and run after it (calls
		// queued on different connections while Redis was paused run in
		// any order when it resumes), finds the record the refund emptied
		// and does nothing: without it, it granted 3 that d never got.
		{"d's older claim after its refund", ms(3000), claim("d", 2, 4, 3), 0, 10},
		// The emptied record is gone after its deadline (1 s after d's grant).
		{"d claims again after the deadline", ms(4100), claim("d", 4, 0, 2), 2, 8},
	}
	for _, s := range steps {
		b.set(s.at)
		if s.op != nil {
			got, err := s.op()
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if got != s.granted {
				t.Errorf("%s: granted %d, want %d", s.name, got, s.granted)
			}
		}
		r, err := tb.AllowN(ctx, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Remaining != s.level {
			t.Errorf("%s: level %d, want %d", s.name, r.Remaining, s.level)
		}
		// A claim of nothing, by no holder, peeks as AllowN(0) does
		// (hybrid's AllowN(0)).
		if n, r, err := tb.Lease(ctx, "k", Claim{}); err != nil || n != 0 || r.Remaining != s.level {
			t.Errorf("%s: Lease(Claim{}) = %d, %+v, %v; want nothing granted and level %d", s.name, n, r, err, s.level)
		}
	}
}

func TestLedgerBesidePlainMiniredis(t *testing.T) { testLedgerBesidePlain(t, miniBackend(t)) }

func TestLedgerBesidePlainRedis(t *testing.T) {
	checkOn(t, redistest.Start(t).Client(t), testLedgerBesidePlain)
}

// testLedgerBesidePlain: a token bucket without a ledger (remote's) on a
// key whose ledger records a lease spends from the level and keeps the
// records as they are, so that the holder's claim sent again is still
// recognised.
func testLedgerBesidePlain(t *testing.T, b backend) {
	ctx := context.Background()
	b.set(t0)
	cfg := b.cfg
	plain, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Hold = time.Second
	ledger, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := Claim{Min: 1, Want: 4, Holder: "a", Gen: 1}
	if n, _, err := ledger.Lease(ctx, "k", c); err != nil || n != 4 {
		t.Fatalf("claim: %d, %v; want 4 granted", n, err)
	}
	if r, err := plain.AllowN(ctx, "k", 2); err != nil || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("plain AllowN(2) = %+v, %v; want allowed, 4 remaining", r, err)
	}
	v, err := b.rdb.Get(ctx, ledger.Keys("k")[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := SplitLedger(v)
	d := t0.Add(time.Second).UnixMicro()
	want := Ledger{Total: 4, Lo: d, Hi: d, Records: []Record{{Holder: "a", Held: 4, Gen: 1, Deadline: d, Handed: 4}}}
	if err != nil || got.Total != want.Total || got.Lo != want.Lo || got.Hi != want.Hi || !slices.Equal(got.Records, want.Records) {
		t.Fatalf("ledger after a plain call = %+v, %v; want %+v", got, err, want)
	}
	// The records live until their deadline, whatever the plain call's
	// own TTL (the time its bucket takes to fill, 600 ms).
	if ttl := b.rdb.PTTL(ctx, ledger.Keys("k")[0]).Val(); ttl < 900*time.Millisecond {
		t.Errorf("TTL after a plain call = %v, want the records' 1 s at least", ttl)
	}
	// The claim sent again: handed its 4 tokens again, taking none.
	if n, r, err := ledger.Lease(ctx, "k", c); err != nil || n != 4 || r.Remaining != 4 {
		t.Errorf("claim sent again: %d, %+v, %v; want 4 granted, 4 remaining", n, r, err)
	}
}

func TestLeaseLedgerOrphanMiniredis(t *testing.T) { testLeaseLedgerOrphan(t, miniBackend(t)) }

func TestLeaseLedgerOrphanRedis(t *testing.T) {
	checkOn(t, redistest.Start(t).Client(t), testLeaseLedgerOrphan)
}

// testLeaseLedgerOrphan: a claim whose reply the holder never got (it ran,
// or it did not): the holder's next claim, which says what the holder
// received (Received), is handed what the orphan granted, once, and takes
// nothing twice.
// With an extra limit that does not bind, every step is the same: the
// orphan's grant is recorded in both ledgers and handed over once.
func testLeaseLedgerOrphan(t *testing.T, b backend) {
	for _, extra := range [][]tierlimit.Limit{nil, {tierlimit.PerHour(1000)}} {
		t.Run(fmt.Sprintf("%d limits", 1+len(extra)), func(t *testing.T) {
			playOrphans(t, b, extra)
		})
	}
}

func playOrphans(t *testing.T, b backend, extra []tierlimit.Limit) {
	ctx := context.Background()
	cfg := b.cfg
	cfg.Hold = time.Hour
	cfg.Extra = extra
	cfg.Prefix = fmt.Sprintf("orphans%d:", len(extra))
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerHour(100), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.set(t0) // the clock stands still: no refill
	type step struct {
		name     string
		c        Claim
		granted  int64
		remained int64
	}
	for _, s := range []step{
		{"a claims 10, holding 0", Claim{Min: 1, Want: 10, Holder: "a", Gen: 1}, 10, 90},
		// a spent 4 of them; its claim 2 runs, but a never hears back.
		{"a's claim 2 (its reply lost)", Claim{Min: 1, Want: 20, Holder: "a", Gen: 2, Held: 6, Received: 10}, 20, 70},
		// Claim 3 says a received 10: claim 2's 20 come back, with 5 new ones.
		{"a's claim 3 after the lost reply", Claim{Min: 1, Want: 5, Holder: "a", Gen: 3, Held: 6, Received: 10}, 25, 65},
		// go-redis sends claim 3 again (its connection broke after the
		// write): it is handed the same 25, and nothing is taken again.
		{"a's claim 3 sent again", Claim{Min: 1, Want: 5, Holder: "a", Gen: 3, Held: 6, Received: 10}, 25, 65},
		// A lost claim that never ran (the entry is at claim 1): nothing.
		{"b's first claim", Claim{Min: 1, Want: 10, Holder: "b", Gen: 1}, 10, 55},
		{"b's claim after one that did not run", Claim{Min: 1, Want: 10, Holder: "b", Gen: 3, Held: 10, Received: 10}, 10, 45},
		// The lost grant is what it handed out, whatever the holder said
		// it held: here more than its record (a give-back into its lease).
		{"e claims 10", Claim{Min: 1, Want: 10, Holder: "e", Gen: 1}, 10, 35},
		{"e's claim 2, holding 15 (reply lost)", Claim{Min: 1, Want: 5, Holder: "e", Gen: 2, Held: 15, Received: 10}, 5, 30},
		{"e's claim 3 after it", Claim{Min: 1, Want: 5, Holder: "e", Gen: 3, Held: 15, Received: 10}, 10, 25},
		// Two replies lost in a row: claim 3 handed claim 2's grant and 5
		// more, and claim 4 gets both.
		{"f claims 10", Claim{Min: 1, Want: 10, Holder: "f", Gen: 1}, 10, 15},
		{"f's claim 2 (reply lost)", Claim{Min: 1, Want: 5, Holder: "f", Gen: 2, Held: 10, Received: 10}, 5, 10},
		{"f's claim 3 (reply lost too)", Claim{Min: 1, Want: 5, Holder: "f", Gen: 3, Held: 10, Received: 10}, 10, 5},
		{"f's claim 4", Claim{Min: 1, Want: 1, Holder: "f", Gen: 4, Held: 10, Received: 10}, 11, 4},
		{"f's claim 4 sent again", Claim{Min: 1, Want: 1, Holder: "f", Gen: 4, Held: 10, Received: 10}, 11, 4},
		// The undelivered covers min: a claim of at least 3 with 4
		// undelivered is granted with nothing left to take.
		{"c drains the bucket, reply lost", Claim{Min: 1, Want: 4, Holder: "c", Gen: 1}, 4, 0},
		{"c's claim of 3 on an empty bucket", Claim{Min: 3, Want: 3, Holder: "c", Gen: 2}, 4, 0},
	} {
		n, r, err := tb.Lease(ctx, "k", s.c)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n != s.granted || r.Remaining != s.remained || !r.Allowed {
			t.Errorf("%s: granted %d, %+v; want %d granted, allowed, %d remaining", s.name, n, r, s.granted, s.remained)
		}
	}
	// A refund covers the calls numbered before its own: h's janitor takes
	// its 10 tokens after claim 2 (its reply lost), as refund 3, but claim
	// 4 runs before the refund does. Claim 4 is handed claim 2's 5 and 5
	// more, and its record no longer counts the 10 (h said it held none):
	// they go back as the bucket refills. The refund, older than the
	// record, gives nothing back: claim 4's ten are h's (a refund once gave
	// them back too, and minted them).
	for _, c := range []Claim{
		{Min: 1, Want: 10, Holder: "h", Gen: 1},
		{Min: 1, Want: 5, Holder: "h", Gen: 2, Held: 10, Received: 10},
		{Min: 1, Want: 5, Holder: "h", Gen: 4, Received: 10},
	} {
		if _, _, err := tb.Lease(ctx, "k2", c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.Refund(ctx, Refund{Key: "k2", N: 10, Holder: "h", Gen: 3, Received: 10}); err != nil {
		t.Fatal(err)
	}
	if r, err := tb.AllowN(ctx, "k2", 0); err != nil || r.Remaining != 80 {
		t.Errorf("after a refund of 10 racing claim 4: %+v, %v; want 80 remaining (100 - 10 - 5 - 5)", r, err)
	}
}

func TestLeaseLedgerInput(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	ledger, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), Config{})
	if err != nil {
		t.Fatal(err)
	}
	gcra, err := New(b.rdb, GCRA, tierlimit.PerSecond(10), Config{})
	if err != nil {
		t.Fatal(err)
	}
	long := string(make([]byte, 65))
	claims := []struct {
		tb   *Limiter
		c    Claim
		want error
	}{
		{ledger, Claim{Min: 1, Want: 1}, tierlimit.ErrInvalidCost},                       // no Gen
		{ledger, Claim{Min: 1, Want: 1, Gen: 1}, tierlimit.ErrInvalidKey},                // no holder
		{ledger, Claim{Min: 1, Want: 1, Gen: 1, Holder: long}, tierlimit.ErrInvalidKey},  // holder too long
		{ledger, Claim{Min: 1, Want: 1, Gen: 1, Holder: "a:b"}, tierlimit.ErrInvalidKey}, // spells a record's fields
		{ledger, Claim{Min: 1, Want: 1, Gen: 1, Holder: "a;b"}, tierlimit.ErrInvalidKey}, // spells the records' separator
		{ledger, Claim{Min: 1, Want: 1, Gen: 1, Holder: "a", Held: -1}, tierlimit.ErrInvalidCost},
		{ledger, Claim{Min: 1, Want: 1, Gen: 2, Holder: "a", Received: -1}, tierlimit.ErrInvalidCost}, // a negative total received
		{ledger, Claim{Min: 2, Want: 1, Gen: 1, Holder: "a"}, tierlimit.ErrInvalidCost},               // Min above Want
		{ledger, Claim{Min: -1, Want: 1, Gen: 1, Holder: "a"}, tierlimit.ErrInvalidCost},
		{ledger, Claim{Want: 11, Gen: 1, Holder: "a"}, tierlimit.ErrInvalidCost}, // above capacity
		{plain, Claim{Min: 1, Want: 1, Gen: 1, Holder: "a"}, errNoLease},         // only a ledger leases
		{gcra, Claim{Min: 1, Want: 1, Gen: 1, Holder: "a"}, errNoLease},
	}
	for _, c := range claims {
		if _, _, err := c.tb.Lease(ctx, "k", c.c); !errors.Is(err, c.want) {
			t.Errorf("Lease(%+v) = %v, want %v", c.c, err, c.want)
		}
	}
	for _, r := range []struct {
		r    Refund
		want error
	}{
		{Refund{Key: "k", N: 1}, tierlimit.ErrInvalidKey}, // no holder
		{Refund{Key: "", N: 1, Holder: "a", Gen: 2}, tierlimit.ErrInvalidKey},
		{Refund{Key: "k", N: -1, Holder: "a", Gen: 2}, tierlimit.ErrInvalidCost},
		{Refund{Key: "k", N: tierlimit.MaxRate + 1, Holder: "a", Gen: 2}, tierlimit.ErrInvalidCost},
		{Refund{Key: "k", Spent: 11, Holder: "a", Gen: 2}, tierlimit.ErrInvalidCost},
	} {
		if failed, err := ledger.Refund(ctx, r.r); !errors.Is(err, r.want) || len(failed) != 1 {
			t.Errorf("Refund(%+v) = %v, %v; want %v, failed", r.r, failed, err, r.want)
		}
	}
	for _, cfg := range []Config{
		{Hold: -time.Second},
		{Hold: time.Microsecond},
		{Hold: 3 * time.Hour},
	} {
		if _, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), cfg); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("New(TokenBucket, %+v) = %v, want ErrInvalidOption", cfg, err)
		}
	}
	if _, err := New(b.rdb, GCRA, tierlimit.PerSecond(10), Config{Hold: time.Second}); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("New(GCRA, a ledger) = %v, want ErrInvalidOption", err)
	}
}

// FuzzLedger plays three holders against a bucket with a lease ledger, as
// hybrid instances use it: they claim (reporting what they hold), spend
// what they hold, refund it, and drop it one lease TTL after their last
// grant, as hybrid's janitor does, while time steps on. After every step
// the stored level plus the ledger's records stay within capacity, and
// every holder holds at most its record; at the end, over every interval
// between two steps, the holders spent at most capacity + rate·T: G1,
// whatever the order of claims, refunds, spends and pauses.
func FuzzLedger(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x02, 0x14, 0x15, 0x16, 0xf3, 0x00, 0x01, 0x02, 0x14, 0x15})
	f.Add([]byte("claims, a pause longer than the TTL, then a surge of spends"))
	f.Add([]byte{0x70, 0x71, 0x72, 0x37, 0x04, 0x05, 0x06, 0x77, 0x74, 0x75, 0x76, 0x08, 0x09, 0x0a, 0xb7})
	// a leases 16 (the level is capped at 4), spends them just before its
	// TTL ends, and its record ends 0.5 s later: the level must grow from
	// 4 from then on, not jump to what the ceiling allows, or b spends so
	// much more that the 0.6 s from a's spends admit over their bound of
	// 26 (28 with a lazy refill).
	f.Add([]byte{0x70, 0x70, 0x6c, 0x44, 0x44, 0x44, 0x44, 0x4c, 0x71, 0x71, 0x71, 0x45, 0x45, 0x45, 0x45, 0x45})
	m, rdb := redistest.Mini(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 300 {
			ops = ops[:300]
		}
		// One limit, and two: a grant is recorded in both ledgers, and
		// each limit's bound holds.
		for _, extra := range [][]tierlimit.Limit{nil, {tierlimit.PerMinute(240).WithBurst(15)}} {
			playLedger(t, m, rdb, ops, extra)
		}
	})
}

// playLedger plays FuzzLedger's ops on a bucket of PerSecond(10) with a
// burst of 20 and the extra limits.
func playLedger(t *testing.T, m *miniredis.Miniredis, rdb *redis.Client, ops []byte, extra []tierlimit.Limit) {
	{
		m.FlushAll()
		ctx := context.Background()
		const ttl = time.Second // a holder spends its tokens for one TTL after its last grant
		limit := tierlimit.PerSecond(10).WithBurst(20)
		limits := append([]tierlimit.Limit{limit}, extra...)
		tb, err := New(rdb, TokenBucket, limit, Config{Hold: ttl + ttl/2, Extra: extra})
		if err != nil {
			t.Fatal(err)
		}
		keys := tb.Keys("k")
		now := t0
		m.SetTime(now)
		type holder struct {
			name                string
			gen, held, received int64
			until               time.Time // spends nothing from then on
		}
		hs := []*holder{{name: "a"}, {name: "b"}, {name: "c"}}
		var spent int64
		type point struct {
			at    time.Time
			spent int64
		}
		points := []point{{now, 0}}
		refunds := 0
		refund := func(h *holder) {
			if h.held == 0 {
				return
			}
			refunds++
			h.gen++ // a refund is numbered after the claims before it
			if _, err := tb.Refund(ctx, Refund{Key: "k", N: h.held, Holder: h.name, Gen: h.gen, Received: h.received, ID: "r" + string(rune('0'+refunds))}); err != nil {
				t.Fatal(err)
			}
			h.held = 0
		}
		for _, op := range ops {
			h, arg := hs[int(op&3)%3], int64(op>>4)
			switch op >> 2 & 3 {
			case 0: // claim; with arg's bit 3, its reply is lost and go-redis sends it again
				h.gen++
				c := Claim{Min: 1, Want: arg%8 + 1, Holder: h.name, Gen: h.gen, Held: h.held, Received: h.received}
				lease := func() (int64, error) { n, _, err := tb.Lease(ctx, "k", c); return n, err }
				if h.gen%2 == 0 { // every other claim in batch mode, as refills claim
					lease = func() (int64, error) { g := tb.LeaseBatch(ctx, []string{"k"}, []Claim{c})[0]; return g.Granted, g.Err }
				}
				if arg&8 != 0 {
					if _, err := lease(); err != nil {
						t.Fatal(err)
					}
				}
				n, err := lease()
				if err != nil {
					t.Fatal(err)
				}
				h.received += n
				if n > 0 {
					h.held += n
					h.until = now.Add(ttl)
				}
			case 1: // spend
				n := min(h.held, arg%5)
				h.held -= n
				spent += n
			case 2:
				refund(h)
			case 3: // time passes; holders whose lease ran out give it back
				now = now.Add(time.Duration(arg) * 150 * time.Millisecond)
				m.SetTime(now)
				for _, h := range hs {
					if !now.Before(h.until) {
						refund(h)
					}
				}
			}
			points = append(points, point{now, spent})

			// Every limit's stored level and records stay within its
			// capacity, and each holder holds at most its record.
			for i, lim := range limits {
				v, err := rdb.Get(ctx, keys[i]).Result()
				state, ledger, perr := SplitLedger(v)
				if perr != nil {
					t.Fatal(perr)
				}
				var sum int64
				for _, x := range ledger.Records {
					sum += x.Held
					if x.Deadline < ledger.Lo || x.Deadline > ledger.Hi {
						t.Fatalf("limit %v: record %+v's deadline outside the ledger's [%d, %d]", lim, x, ledger.Lo, ledger.Hi)
					}
				}
				if sum != ledger.Total {
					t.Fatalf("limit %v: records hold %d, the ledger's total says %d: %q", lim, sum, ledger.Total, v)
				}
				for _, h := range hs {
					var rec int64
					for _, x := range ledger.Records {
						if x.Holder == h.name {
							rec = x.Held
						}
					}
					if h.held > rec {
						t.Fatalf("limit %v: holder %s holds %d, its record %d", lim, h.name, h.held, rec)
					}
				}
				if err == nil {
					var k, r, ts int64
					if _, err := fmt.Sscanf(state, "%d:%d:%d", &k, &r, &ts); err != nil {
						t.Fatalf("state %q: %v", v, err)
					}
					if k+sum > lim.Capacity() || k+sum == lim.Capacity() && r > 0 {
						t.Fatalf("limit %v: level %d tokens + %d/unit + records %d tokens > capacity %d", lim, k, r, sum, lim.Capacity())
					}
				} else if sum > lim.Capacity() {
					t.Fatalf("limit %v: records %d > capacity %d", lim, sum, lim.Capacity())
				}
			}
		}
		// G1 over every interval between two steps, for every limit.
		for i, p := range points {
			for _, q := range points[i+1:] {
				for _, lim := range limits {
					bound := lim.Capacity() + int64(q.at.Sub(p.at)/lim.Every())
					if got := q.spent - p.spent; got > bound {
						t.Fatalf("limit %v: spent %d over %v, bound %d", lim, got, q.at.Sub(p.at), bound)
					}
				}
			}
		}
	}
}

// TestLedgerBatch runs claims of many keys, with an extra limit, as one
// LeaseBatch (ledger.lua's batch mode: one script call per slot) and
// checks each grant, each key's level and ledger against what the same
// claims give one by one; on a Cluster the keys fall in many slots.
func TestLedgerBatch(t *testing.T) {
	onEachServer(t, ledgerBatch)
}

func ledgerBatch(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	clock := &clocktest.Clock{}
	clock.Set(t0)
	cfg := Config{Hold: time.Second, Clock: clock, Extra: []tierlimit.Limit{tierlimit.PerMinute(100)}}
	cfg.Prefix = "batch:"
	batched, err := New(rdb, TokenBucket, tierlimit.PerSecond(10).WithBurst(20), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Prefix = "single:"
	single, err := New(rdb, TokenBucket, tierlimit.PerSecond(10).WithBurst(20), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 300 claims (more than one batch): three holders claim on 100 keys in
	// turn, some more than a key holds, some sent again, some peeks.
	var keys []string
	var claims []Claim
	for i := range 300 {
		h := i / 100
		c := Claim{Min: 1, Want: int64(3 + i%11), Holder: fmt.Sprintf("h%d", h), Gen: int64(1 + h), Held: int64(i % 4)}
		switch i % 7 {
		case 3:
			c = Claim{} // a peek
		case 5:
			c.Min = c.Want // all or nothing
		}
		keys = append(keys, fmt.Sprintf("k%d", i%100))
		claims = append(claims, c)
	}
	// A claim sent again: the same Gen as its holder's record.
	keys, claims = append(keys, "k7"), append(claims, claims[207])
	grants := batched.LeaseBatch(ctx, keys, claims)
	for i, c := range claims {
		n, res, err := single.Lease(ctx, keys[i], c)
		g := grants[i]
		if g.Err != nil || err != nil || g.Granted != n || g.Result != res {
			t.Fatalf("claim %d %+v of %s: batched %d, %+v, %v; one by one %d, %+v, %v", i, c, keys[i], g.Granted, g.Result, g.Err, n, res, err)
		}
	}
	for i := range 100 {
		key := fmt.Sprintf("k%d", i)
		for j, k := range batched.Keys(key) {
			got, _ := rdb.Get(ctx, k).Result()
			want, _ := rdb.Get(ctx, single.Keys(key)[j]).Result()
			if got != want {
				t.Errorf("%s: batched state %q, one by one %q", k, got, want)
			}
		}
	}
}
