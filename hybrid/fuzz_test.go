package hybrid

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// FuzzOps runs arbitrary sequences of AllowN, Reset, time steps and lease
// expiries against miniredis, without the lease ledger for inputs of odd
// length (as WithLimits runs), then closes the limiter. It checks that the
// ledger balances, that Stats.Spent equals what was admitted, that Remaining
// stays within [0, Burst], and that a key whose time never moved holds
// exactly capacity minus what was admitted in Redis (nothing lost when no
// time moved).
func FuzzOps(f *testing.F) {
	f.Add([]byte{0x04, 0x05, 0x06, 0x07, 0xf0, 0x08, 0x09})
	f.Add([]byte{0x0c, 0x0c, 0x0c, 0xc1, 0x0c, 0xe2, 0x0c, 0xd3})
	f.Add([]byte{0xff, 0x00, 0x80, 0x7f, 0x3c, 0x3d, 0x3e, 0x3f})
	f.Add([]byte("a hot key, then resets and time steps"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		e := newEnv(t)
		limit := tierlimit.PerHour(40)
		opts := []Option{WithLeaseBounds(1, 8), WithMaxKeys(64), WithCallBudget(10 * time.Second)}
		l := e.limiter(t, limit, opts...)
		var admitted int64
		spent := map[string]int64{}  // since the key's last Reset
		stepped := map[string]bool{} // time moved since the key's last Reset
		keys := []string{"a", "b", "c", "d"}
		for _, op := range ops {
			key := keys[op&3]
			switch op >> 6 {
			case 0, 1: // AllowN with n in [0, 7]
				n := int64(op>>2) & 7
				r, err := l.AllowN(e.ctx, key, n)
				if err != nil {
					t.Fatalf("AllowN(%s, %d) = %v", key, n, err)
				}
				if r.Remaining < 0 || r.Remaining > limit.Capacity() {
					t.Fatalf("Remaining = %d, want within [0, %d]", r.Remaining, limit.Capacity())
				}
				if r.Allowed {
					admitted += n
					spent[key] += n
				}
			case 2: // time step of up to 15 s
				e.step(time.Duration(op&15) * time.Second)
				for _, k := range keys {
					stepped[k] = stepped[k] || op&15 != 0
				}
			default:
				if op&4 != 0 {
					if err := l.Reset(e.ctx, key); err != nil {
						t.Fatal(err)
					}
					spent[key], stepped[key] = 0, false
				} else if err := l.refundHeld(e.clock.Now(), op&8 != 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		audit := map[string]int64{}
		anyStepped := false
		for _, k := range keys {
			if !stepped[k] { // a key whose time moved refilled: no exact level to expect
				audit[k] = spent[k]
			}
			anyStepped = anyStepped || stepped[k]
		}
		e.closeAndAuditAfter(t, l, admitted, audit, anyStepped)
	})
}
