package store

import (
	"context"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/script"
)

// A concurrency limiter keeps each key's permits in two keys beside each
// other on one slot (permits.lua): a sorted set of holders by expiry and a
// hash of what each holds. remote gives each permit a holder of its own;
// hybrid holds a block of permits per key and instance under one holder.

// PermitKeys returns the Redis keys of user key's permits under prefix:
// <prefix>cc:0:{<tag>}:<key>:z (holders by expiry) and ...:h (their counts),
// on one slot.
func PermitKeys(prefix, key string) []string {
	tag := keyTag(key)
	base := prefix + "cc:0:{" + string(tag[:]) + "}:" + key
	return []string{base + ":z", base + ":h"}
}

// PermitSlot returns the Cluster slot of user key's permits.
func PermitSlot(key string) int {
	tag := keyTag(key)
	return slotOf(string(tag[:]))
}

// SetPermits moves holder's permits at keys (PermitKeys) to target, a rise
// granted up to what the key's limit n leaves free (all of it with force),
// each held permit expiring ttl from now on Redis's clock. It returns what
// the holder now holds and the key's total.
func SetPermits(ctx context.Context, rdb redis.UniversalClient, keys []string, holder string, target, n int64, ttl time.Duration, force bool) (count, total int64, err error) {
	f := "0"
	if force {
		f = "1"
	}
	r, err := script.Permits.Run(ctx, rdb, keys, 0, "s", holder, target, n, ttl.Milliseconds(), f).Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(r) != 2 {
		return 0, 0, fmt.Errorf("permits: reply of %d values, want 2", len(r))
	}
	return r[0], r[1], nil
}

// Renewal is one key's holders to renew (RenewPermits).
type Renewal struct {
	Keys    []string // PermitKeys
	Holders []string
	// Want, if set, is what each holder holds in the caller's view: a
	// holder the key lost is recorded again with it, whatever the total
	// (its permits are in flight), and its Counts entry is minus it.
	Want   []int64
	Counts []int64 // set by RenewPermits: what each holder still holds (0: lost)
	Err    error   // set by RenewPermits
}

// RenewPermits extends every renewal's holders to expire ttl from now, in one
// pipeline (go-redis sends it per node of a Cluster), and sets each one's
// Counts or Err. A renewal is idempotent: calls answered NOSCRIPT are sent
// again with EVAL.
func RenewPermits(ctx context.Context, rdb redis.UniversalClient, ttl time.Duration, rs []Renewal) {
	send := func(only []int, eval bool) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(only))
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, i := range only {
				args := make([]any, 0, 3+2*len(rs[i].Holders))
				if rs[i].Want == nil {
					args = append(args, 0, "r", ttl.Milliseconds())
					for _, h := range rs[i].Holders {
						args = append(args, h)
					}
				} else {
					args = append(args, 0, "R", ttl.Milliseconds())
					for j, h := range rs[i].Holders {
						args = append(args, h, rs[i].Want[j])
					}
				}
				if !eval {
					cmds[j] = script.Permits.EvalSha(ctx, p, rs[i].Keys, args...)
				} else {
					cmds[j] = script.Permits.Eval(ctx, p, rs[i].Keys, args...)
				}
			}
			return nil
		})
		return cmds
	}
	all := make([]int, len(rs))
	for i := range all {
		all[i] = i
	}
	cmds := send(all, false)
	var again []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		for j, c := range send(again, true) {
			cmds[again[j]] = c
		}
	}
	for i, c := range cmds {
		rs[i].Counts, rs[i].Err = c.Int64Slice()
		if rs[i].Err == nil && len(rs[i].Counts) != len(rs[i].Holders) {
			rs[i].Err = fmt.Errorf("permits: renewal reply of %d counts, want %d", len(rs[i].Counts), len(rs[i].Holders))
		}
	}
}

// PermitFleetKey returns the Redis key of the fleet (see Heartbeat) of the
// hybrid concurrency limiters of n permits per key under prefix:
// <prefix>fleet:<16 hex>, the hex of a hash that no rate limit's fleet
// (FleetKey) shares.
func PermitFleetKey(prefix string, n int64) string {
	return fmt.Sprintf("%sfleet:%016x", prefix, xxhash.Sum64String(fmt.Sprintf("permits/%d", n)))
}

// LoadPermits loads permits.lua into Redis's script cache (every master of
// a Cluster), so that a first acquisition finds it by its SHA.
func LoadPermits(ctx context.Context, rdb redis.UniversalClient) error {
	return script.Permits.Load(ctx, rdb).Err()
}
