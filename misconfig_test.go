package tierlimit_test

// Redis set-ups an operator meets that make a limiter unable to work: each
// is an error wrapping tierlimit.ErrMisconfigured, from New or from the
// first call, on every tier that uses Redis; never a silent allow, a denial
// or a fallback decision.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// first makes tier's limiter on rdb and its first decision: it returns the
// error of New, or else of the first AllowN, and what the limiter decided.
// A hybrid fallback decision is an error: it would hide the set-up.
func first(ctx context.Context, tier tier, rdb redis.UniversalClient) (tierlimit.Result, error) {
	l, err := tier.new(rdb, tierlimit.PerSecond(10), tierOptions{})
	if err != nil {
		return tierlimit.Result{}, err
	}
	defer l.Close()
	res, err := l.AllowN(ctx, "k", 1)
	if h, ok := l.(*hybrid.Limiter); ok && h.Stats().Fallback != 0 {
		return res, errors.New("a fallback decision, not an error")
	}
	return res, err
}

// TestMisconfigurationMatrix: every Redis set-up that cannot run the
// limiters, through go-redis's default client and every tier's default
// options, is ErrMisconfigured.
func TestMisconfigurationMatrix(t *testing.T) {
	ctx := context.Background()
	protected := redistest.Start(t, "--requirepass", "secret")
	admin := protected.Client(t)
	for _, acl := range [][]string{
		{"noevalsha", "on", ">pw", "~*", "+@all", "-evalsha"},
		{"noscripts", "on", ">pw", "~*", "+@all", "-evalsha", "-eval"},
		{"nowrite", "on", ">pw", "~other:*", "+@all"},
		// Every command, scripts included, but the keys read-only: the
		// one thing missing is write on the prefix.
		{"readkeys", "on", ">pw", "%R~*", "+@all"},
	} {
		if err := admin.Do(ctx, append([]any{"ACL", "SETUSER"}, toAny(acl)...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	noEvalSha := redistest.Start(t, "--rename-command", "EVALSHA", "")
	noScripts := redistest.Start(t, "--rename-command", "EVALSHA", "", "--rename-command", "EVAL", "")
	// EVAL renamed alone: go-redis falls back to EVAL only on NOSCRIPT, so
	// this cell is the server whose script cache is empty (fresh, restarted
	// or after SCRIPT FLUSH). Had an operator loaded the scripts by hand,
	// EVALSHA would run them: no misconfiguration until the next restart.
	// Nothing here can load a script (the limiters send them with EVAL, and
	// EVAL is gone), and each subtest checks the cache is empty.
	noEval := redistest.Start(t, "--rename-command", "EVAL", "")
	noEvalAdmin := noEval.Client(t)
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	full := redistest.Start(t, "--maxmemory-policy", "noeviction")
	fill(t, full.Client(t))

	emptyScriptCache := func(t *testing.T) {
		info, err := noEvalAdmin.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n := infoField(t, info, "number_of_cached_scripts"); n != 0 {
			t.Fatalf("%d scripts cached on the server without EVAL, want 0: EVALSHA would not get NOSCRIPT", n)
		}
	}

	setups := []struct {
		name string
		opts redis.Options
		// before, if set, checks the server is in the state the cell
		// describes.
		before func(t *testing.T)
	}{
		{"EVALSHA renamed away", redis.Options{Addr: noEvalSha.Addr}, nil},
		{"EVALSHA and EVAL renamed away", redis.Options{Addr: noScripts.Addr}, nil},
		{"EVAL renamed away, no script cached", redis.Options{Addr: noEval.Addr}, emptyScriptCache},
		{"user without EVALSHA", redis.Options{Addr: protected.Addr, Username: "noevalsha", Password: "pw"}, nil},
		{"user without scripts", redis.Options{Addr: protected.Addr, Username: "noscripts", Password: "pw"}, nil},
		{"user without write on the prefix", redis.Options{Addr: protected.Addr, Username: "nowrite", Password: "pw"}, nil},
		{"user with read-only keys", redis.Options{Addr: protected.Addr, Username: "readkeys", Password: "pw"}, nil},
		{"no password", redis.Options{Addr: protected.Addr}, nil},
		{"wrong password", redis.Options{Addr: protected.Addr, Password: "wrong"}, nil},
		{"read-only replica", redis.Options{Addr: replica.Addr}, nil},
		{"full under noeviction", redis.Options{Addr: full.Addr}, nil},
	}
	for _, s := range setups {
		for _, tier := range tiers {
			if !tier.redis {
				continue
			}
			t.Run(s.name+"/"+tier.name, func(t *testing.T) {
				if s.before != nil {
					s.before(t)
				}
				opts := s.opts
				rdb := redis.NewClient(&opts)
				defer rdb.Close()
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				res, err := first(cctx, tier, rdb)
				if !errors.Is(err, tierlimit.ErrMisconfigured) {
					t.Fatalf("New, then Allow = %+v, %v; want an error wrapping ErrMisconfigured", res, err)
				}
				t.Logf("%v", err)
			})
		}
	}
}

// fill lowers the server's maxmemory below what it uses, so that under
// noeviction every write is refused with OOM.
func fill(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.Set(ctx, "filler", strings.Repeat("x", 1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used := infoField(t, info, "used_memory")
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "one-more", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write to the full server = %v, want OOM", err)
	}
}

// infoField returns an integer field of an INFO reply.
func infoField(t *testing.T, info, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", name)
	return 0
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestMisconfiguredAtRunTime: a fleet of three hybrid limiters whose Redis
// set-up breaks while they run: their user loses the right to run scripts
// or to write the keys, its password changes (and its connections are
// dropped, as a rotation or a restart does), it is deleted, or the server
// fills up under noeviction. Every decision that needs Redis is then an
// error wrapping ErrMisconfigured, not a fallback decision; the fleet's
// count stays at three, though the failed heartbeats let every member's
// record expire; and once the set-up is mended, the limiters decide again
// without errors.
func TestMisconfiguredAtRunTime(t *testing.T) {
	type change func(t *testing.T, ctx context.Context, admin *redis.Client)
	setUser := func(rules ...string) change {
		return func(t *testing.T, ctx context.Context, admin *redis.Client) {
			t.Helper()
			if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", "app"}, toAny(rules)...)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	do := func(args ...any) change {
		return func(t *testing.T, ctx context.Context, admin *redis.Client) {
			t.Helper()
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	both := func(a, b change) change {
		return func(t *testing.T, ctx context.Context, admin *redis.Client) {
			t.Helper()
			a(t, ctx, admin)
			b(t, ctx, admin)
		}
	}
	for _, tt := range []struct {
		name        string
		spoil, mend change
	}{
		{"scripts revoked", setUser("-evalsha", "-eval"), setUser("+evalsha", "+eval")},
		{"write on the keys revoked", setUser("resetkeys", "%R~*"), setUser("resetkeys", "~*")},
		{"password changed", both(setUser("resetpass", ">other"), do("CLIENT", "KILL", "USER", "app")), setUser("resetpass", ">pw")},
		// ACL DELUSER drops the user's connections itself.
		{"user deleted", do("ACL", "DELUSER", "app"), setUser("on", ">pw", "~*", "+@all")},
		{"full under noeviction", func(t *testing.T, _ context.Context, admin *redis.Client) { fill(t, admin) },
			do("CONFIG", "SET", "maxmemory", "0")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := redistest.Start(t, "--requirepass", "secret", "--maxmemory-policy", "noeviction")
			admin := s.Client(t)
			setUser("on", ">pw", "~*", "+@all")(t, ctx, admin)
			limit := tierlimit.PerSecond(1000)
			var fleet []*hybrid.Limiter
			var failedBeats [3]atomic.Int64
			for i := range 3 {
				rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "app", Password: "pw"})
				defer rdb.Close()
				o := &tierlimit.Observer{RedisCall: func(rc tierlimit.RedisCall) {
					if rc.Op == "heartbeat" && rc.Err != nil {
						failedBeats[i].Add(1)
					}
				}}
				l, err := hybrid.New(rdb, limit, hybrid.WithHeartbeat(50*time.Millisecond), hybrid.WithObserver(o))
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				fleet = append(fleet, l)
			}
			// Every member has seen the others (a loaded machine may take
			// a few beats).
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				seen := 0
				for _, l := range fleet {
					if l.Stats().Instances == 3 {
						seen++
					}
				}
				if seen == len(fleet) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of 3 members count 3 instances 10 s after New, want all", seen)
				}
			}

			var beatsBefore [3]int64
			for i := range fleet {
				beatsBefore[i] = failedBeats[i].Load()
			}
			tt.spoil(t, ctx, admin)
			// Fresh keys need a claim: every decision is an error.
			for i := range 20 {
				res, err := fleet[i%3].Allow(ctx, "key"+strconv.Itoa(i))
				if !errors.Is(err, tierlimit.ErrMisconfigured) {
					t.Fatalf("Allow %d after the change = %+v, %v; want ErrMisconfigured", i, res, err)
				}
				if i == 0 {
					t.Logf("%v", err)
				}
			}
			// Heartbeats fail meanwhile, for longer than a record lives
			// (3 beats): a member that took a failed beat for an empty
			// fleet would count itself alone.
			time.Sleep(300 * time.Millisecond)
			for i, l := range fleet {
				st := l.Stats()
				if st.Instances != 3 || st.Fallback != 0 {
					t.Errorf("member %d: Instances %d, %d fallback decisions; want 3 and 0", i, st.Instances, st.Fallback)
				}
				if n := failedBeats[i].Load() - beatsBefore[i]; n < 3 {
					t.Errorf("member %d: %d heartbeats failed in 300 ms after the change, want at least 3 (one every 50 ms)", i, n)
				}
			}

			tt.mend(t, ctx, admin)
			for i := range 20 {
				if _, err := fleet[i%3].Allow(ctx, "key"+strconv.Itoa(i)); err != nil {
					t.Fatalf("Allow %d after the set-up is mended = %v, want no error", i, err)
				}
			}
		})
	}
}

// TestWrongTopologyIsMisconfigured: a client of the wrong kind for the
// server, on every tier that uses Redis, is ErrMisconfigured from New, not
// an outage that a fallback decides forever: a client for one server
// pointed at a node of a 3-master Redis Cluster (every key on another node
// would get MOVED), and a Cluster client pointed at a standalone server.
func TestWrongTopologyIsMisconfigured(t *testing.T) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t)
	single := redistest.Start(t)
	setups := []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"plain client on a cluster node", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: cluster.Addrs[1]})
		}},
		{"cluster client on a standalone server", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{single.Addr}})
		}},
	}
	for _, s := range setups {
		for _, tier := range tiers {
			if !tier.redis {
				continue
			}
			t.Run(s.name+"/"+tier.name, func(t *testing.T) {
				rdb := s.rdb()
				defer rdb.Close()
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				res, err := first(cctx, tier, rdb)
				if !errors.Is(err, tierlimit.ErrMisconfigured) {
					t.Fatalf("New, then Allow = %+v, %v; want an error wrapping ErrMisconfigured", res, err)
				}
				t.Logf("%v", err)
			})
		}
	}
}
