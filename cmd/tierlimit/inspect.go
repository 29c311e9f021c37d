package main

import (
	"context"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/evict"
	"github.com/tierlimit/tierlimit/internal/store"
	"github.com/tierlimit/tierlimit/internal/xrate"
	"github.com/tierlimit/tierlimit/remote"
)

const inspectSynopsis = `
Usage: tierlimit inspect [-redis URL] [-prefix P] [-rate N -period D -burst N] KEY

Shows the state KEY has in Redis, for operators: every Redis key of ours
that exists for it, under any algorithm and limit, with its algorithm, its
value decoded and its TTL. It finds them with SCAN for keys carrying KEY's
hash tag, which walks the whole keyspace in batches: it never blocks Redis,
but takes a while on a large one. With -rate (and -period, -burst as the
limiter was built), it also tells which keys were written under that limit
and how many tokens or events they have left now. Times are the Redis
server's. It also prints one line on whether Redis may evict the limiters'
keys (from INFO; unknown when INFO is refused).

A Redis Cluster works too: give any node's URL (a node whose INFO says
cluster_enabled:1 is read as the Cluster's seed), or several seeds as in
redis://host1:port1?addr=host2:port2&addr=host3:port3. All of KEY's Redis
keys share one hash tag, so one slot: inspect SCANs the master that owns
it, and reads the eviction settings of every master.
`

// inspectConfig is inspect's command line.
type inspectConfig struct {
	url    string
	prefix string
	key    string
	limit  *tierlimit.Limit // nil: not given
}

// scanBatch is SCAN's COUNT: keys Redis looks at per call.
const scanBatch = 1000

func parseInspect(args []string, stdout io.Writer) (inspectConfig, error) {
	c := inspectConfig{}
	fs := newFlags("inspect")
	fs.StringVar(&c.url, "redis", "redis://127.0.0.1:6379/0", "Redis `URL`: a server, any node of a Cluster, or Cluster seeds as redis://host:port?addr=host2:port2")
	fs.StringVar(&c.prefix, "prefix", remote.DefaultPrefix, "key prefix the limiters were built with")
	rate := fs.Int64("rate", 0, "limit the key was limited with: events per period (0: unknown, decode raw state only)")
	period := fs.Duration("period", time.Second, "limit: the period (with -rate)")
	burst := fs.Int64("burst", 0, "limit: bucket capacity, 0 for the rate (with -rate)")
	if err := parseFlags(fs, args, inspectSynopsis, stdout); err != nil {
		return c, err
	}
	// Flags may also follow the key.
	if fs.NArg() > 0 {
		c.key = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:], inspectSynopsis, stdout); err != nil {
			return c, err
		}
	}
	switch {
	case c.key == "":
		return c, usagef("missing KEY")
	case fs.NArg() > 0:
		return c, usagef("one KEY only, got another: %q", fs.Arg(0))
	case check.Key(c.key) != nil:
		return c, usagef("KEY: %v", check.Key(c.key))
	}
	if *rate != 0 {
		l := tierlimit.Limit{Rate: *rate, Period: *period, Burst: *burst}
		if err := l.Validate(); err != nil {
			return c, usagef("-rate, -period, -burst: %v", err)
		}
		c.limit = &l
	}
	if _, err := tagOf(c.prefix, c.key); err != nil {
		return c, usagef("-prefix %q: %v", c.prefix, err)
	}
	return c, nil
}

func inspect(ctx context.Context, args []string, stdout, _ io.Writer) error {
	c, err := parseInspect(args, stdout)
	if err != nil {
		return err
	}
	tag, _ := tagOf(c.prefix, c.key)
	tgt, err := openTarget(ctx, c.url, tag)
	if err != nil {
		return err
	}
	defer tgt.close()
	keys, err := findKeys(ctx, tgt.node, c.prefix, c.key)
	if err != nil {
		return err
	}
	risk, err := evict.Read(ctx, tgt.all)
	if err != nil {
		risk = tierlimit.EvictionRisk{Err: err} // unknown: the key's state is still worth showing
	}
	if len(keys) == 0 {
		gone := "expired"
		if risk.Risky() {
			gone = "expired or was evicted"
		}
		fmt.Fprintf(stdout, "%q: no keys under prefix %q with tag {%s} on %s: never limited, or its state %s (an absent key is a full bucket, an empty window).\n",
			c.key, c.prefix, tag, tgt.name, gone)
		printRisk(stdout, tgt, risk)
		return nil
	}
	now, err := tgt.node.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("redis TIME: %w", err)
	}
	fmt.Fprintf(stdout, "%q: %d key(s) under prefix %q with tag {%s} on %s\n", c.key, len(keys), c.prefix, tag, tgt.name)
	printRisk(stdout, tgt, risk)
	for _, k := range keys {
		st, err := readKey(ctx, tgt.node, k, now.UnixMicro())
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		st.print(stdout, c)
	}
	return nil
}

// printRisk prints the one line on whether the server(s) may evict our keys.
func printRisk(w io.Writer, tgt *target, risk tierlimit.EvictionRisk) {
	fmt.Fprintf(w, "Eviction, read from %s: %s\n", tgt.servers(), risk)
}

// findKeys returns the keys of ours for key, sorted.
func findKeys(ctx context.Context, rdb *redis.Client, prefix, key string) ([]keyName, error) {
	tag, err := tagOf(prefix, key)
	if err != nil {
		return nil, err
	}
	match := globEscape(prefix) + "*:{" + tag + "}*"
	var found []keyName
	iter := rdb.Scan(ctx, 0, match, scanBatch).Iterator()
	for iter.Next(ctx) {
		if k, ok := parseKeyName(iter.Val(), prefix, key); ok && k.tag == tag {
			found = append(found, k)
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("redis SCAN: %w", err)
	}
	slices.SortFunc(found, func(a, b keyName) int { return strings.Compare(a.full, b.full) })
	return found, nil
}

// keyState is what Redis holds in one key.
type keyState struct {
	name    keyName
	typ     string
	ttl     time.Duration // -1: no TTL (never written so by this library); -2: gone
	raw     string        // strings
	value   string        // raw, a token bucket's without its ledger
	ledger  store.Ledger  // a token bucket's lease ledger, from its string
	bad     error         // a ledger that is not in its format
	entries []redis.Z     // sorted sets, oldest first
	now     int64         // server clock, µs
}

func readKey(ctx context.Context, rdb *redis.Client, k keyName, now int64) (keyState, error) {
	st := keyState{name: k, now: now}
	var typ *redis.StatusCmd
	var ttl *redis.DurationCmd
	var val *redis.StringCmd
	var zs *redis.ZSliceCmd
	// GET fails on a sorted set and ZRANGE on a string: the error that
	// counts is the one of the command that fits the type.
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		typ, ttl = p.Type(ctx, k.full), p.PTTL(ctx, k.full)
		val, zs = p.Get(ctx, k.full), p.ZRangeWithScores(ctx, k.full, 0, -1)
		return nil
	})
	var err error
	st.typ, st.ttl = typ.Val(), ttl.Val()
	switch {
	case typ.Err() != nil:
		err = typ.Err()
	case ttl.Err() != nil:
		err = ttl.Err()
	case st.typ == "string":
		st.raw, err = val.Result()
		st.value = st.raw
		if k.alg == "tb" && err == nil {
			st.value, st.ledger, st.bad = store.SplitLedger(st.raw)
		}
	case st.typ == "zset":
		st.entries, err = zs.Result()
	}
	if err != nil {
		return st, fmt.Errorf("redis: read %q: %w", k.full, err)
	}
	return st, nil
}

// stateFields is how many integers begin a string state of each algorithm,
// before the limit it was written under (none for the sliding log's).
var stateFields = map[string]int{"tb": 3, "gcra": 2, "fw": 2, "aw": 2, "sw": 3}

// lead splits a state "a:b:…:<limit>" into its n leading integers and the
// limit it was written under.
func lead(v string, n int) ([]int64, string, bool) {
	parts := strings.SplitN(v, ":", n+1)
	if len(parts) != n+1 {
		return nil, "", false
	}
	f, ok := fields(strings.Join(parts[:n], ":"), n)
	return f, parts[n], ok
}

// fields splits a "a:b:c" value into n integers (store.ParseInts).
func fields(v string, n int) ([]int64, bool) {
	f, err := store.ParseInts(v, n)
	return f, err == nil
}

// ago formats the server-clock instant at (µs) relative to now.
func (st keyState) ago(at int64) string {
	d := time.Duration(st.now-at) * time.Microsecond
	if d < 0 {
		return "in " + (-d).Round(time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String() + " ago"
}

func (st keyState) print(w io.Writer, c inspectConfig) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-10s %s\n", label, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "%s\n", strconv.Quote(st.name.full))
	alg, known := algorithmNamed(st.name.alg)
	title := alg.title
	if !known {
		title = "unknown to this version of tierlimit"
	}
	line("algorithm", "%s: %s", st.name.alg, title)
	if st.name.refund != "" {
		line("refund", "marker of the idempotent refund %q: Redis applied it and will not again while the marker lives", st.name.refund)
		line("took", "%s of its leased tokens back", st.raw)
		line("ttl", "%v", st.ttl)
		return
	}
	limit := st.matching(c)
	switch {
	case limit != nil:
		line("config", "%s: written under the limit %v", st.name.config, *limit)
	case c.limit != nil:
		line("config", "%s: written under another limit than %v", st.name.config, *c.limit)
	default:
		line("config", "%s (the limit's position: 0 the key's own, 1… the extras; give -rate, -period, -burst to decode against one)", st.name.config)
	}
	switch st.ttl {
	case -2:
		line("ttl", "none: the key expired a moment ago")
		return
	case -1:
		line("ttl", "NONE: every key this library writes has a TTL; this one was written by something else")
	default:
		line("ttl", "%v", st.ttl)
	}
	switch st.typ {
	case "zset":
		st.printLog(line, limit)
		return
	}
	line("value", "%q", st.raw)
	st.decode(line, limit)
	if st.ledger.Records != nil || st.bad != nil {
		st.printLedger(line)
	}
}

// matching returns the -rate limit when it is the one st was written under.
func (st keyState) matching(c inspectConfig) *tierlimit.Limit {
	alg, ok := algorithmNamed(st.name.alg)
	if c.limit == nil || !ok {
		return nil
	}
	if _, err := keysOf(alg, *c.limit, c.prefix, c.key); err != nil {
		return nil // e.g. a burst on a window algorithm: not this limit
	}
	n, ok := stateFields[st.name.alg]
	if !ok || st.typ != "string" || st.name.suffix != "" {
		return c.limit // the sliding log records no limit
	}
	if _, spec, ok := lead(st.value, n); ok && spec == alg.alg.Spec(*c.limit) {
		return c.limit
	}
	return nil
}

// printLedger explains a token bucket's lease ledger: what each holder
// (a hybrid instance's entry for the key) may still spend, and until when.
func (st keyState) printLedger(line func(string, string, ...any)) {
	line("ledger", "tokens leased that holders may still spend: the bucket refills up to capacity minus their sum")
	var sum int64
	for _, r := range st.ledger.Records {
		sum += r.Held
		line("holder", "%s: %d tokens at most, after call #%d, %d handed to it in all; spends none after %s", r.Holder, r.Held, r.Gen, r.Handed, st.ago(r.Deadline))
	}
	if st.bad != nil {
		line("holder", "%v (docs/operations.md)", st.bad)
	}
	line("held", "%d tokens by %d holder(s)", sum, len(st.ledger.Records))
}

// gcraLeft returns the tokens a GCRA key of limit holds at now when its
// TAT is tat + f/per µs (gcra.lua): floor((now + tau − TAT)/T), with
// T = unit/per µs and tau = Capacity·T, in big integers.
func gcraLeft(limit tierlimit.Limit, tat, f, now int64) int64 {
	unit, per := limit.Scale()
	used := new(big.Int) // (TAT − now) × per, when TAT is ahead
	if tat >= now {
		used.Mul(big.NewInt(tat-now), big.NewInt(per))
		used.Add(used, big.NewInt(f))
	}
	left := new(big.Int).Mul(big.NewInt(limit.Capacity()), big.NewInt(unit))
	left.Sub(left, used)
	if left.Sign() < 0 {
		return 0
	}
	return min(limit.Capacity(), left.Quo(left, big.NewInt(unit)).Int64())
}

// decode explains a string value; limit, when known, turns it into what is
// left now.
func (st keyState) decode(line func(string, string, ...any), limit *tierlimit.Limit) {
	bad := func() { line("state", "not in the format of %s (docs/operations.md)", st.name.alg) }
	if n, ok := stateFields[st.name.alg]; ok {
		_, spec, ok := lead(st.value, n)
		if !ok {
			bad()
			return
		}
		line("limit", "written under %s (docs/operations.md)", spec)
	}
	switch st.name.alg {
	case "tb":
		f, _, ok := lead(st.value, 3)
		if !ok {
			bad()
			return
		}
		line("state", "level %d tokens and %d units of the next, written %s", f[0], f[1], st.ago(f[2]))
		if limit != nil {
			// The level refilled since, as the script's arithmetic has it.
			unit, _ := limit.Scale()
			k, r := xrate.NewState(*limit, f[0], f[1], time.UnixMicro(f[2])).Level(time.UnixMicro(st.now))
			line("now", "%.2f of %d tokens, refilled since (up to capacity minus what its lease ledger holds)",
				float64(k)+float64(r)/float64(unit), limit.Capacity())
		}
	case "gcra":
		f, _, ok := lead(st.value, 2)
		if !ok {
			bad()
			return
		}
		line("state", "theoretical arrival time %s (and %d units of a µs)", st.ago(f[0]), f[1])
		if limit != nil {
			line("now", "%d of %d tokens", gcraLeft(*limit, f[0], f[1], st.now), limit.Capacity())
		}
	case "fw":
		f, _, ok := lead(st.value, 2)
		if !ok {
			bad()
			return
		}
		line("state", "window #%d, count %d", f[0], f[1])
		if limit != nil {
			p := limit.PeriodMicros()
			if st.now/p == f[0] {
				line("now", "%d of %d left, the window ends in %v", limit.Rate-f[1], limit.Rate, micros((f[0]+1)*p-st.now))
			} else {
				line("now", "%d of %d left: the window has ended", limit.Rate, limit.Rate)
			}
		}
	case "aw":
		f, _, ok := lead(st.value, 2)
		if !ok {
			bad()
			return
		}
		line("state", "window opened %s, count %d", st.ago(f[0]), f[1])
		if limit != nil {
			if end := f[0] + limit.PeriodMicros(); end > st.now {
				line("now", "%d of %d left, the window ends in %v", limit.Rate-f[1], limit.Rate, micros(end-st.now))
			} else {
				line("now", "%d of %d left: the window has ended", limit.Rate, limit.Rate)
			}
		}
	case "sw":
		f, _, ok := lead(st.value, 3)
		if !ok {
			bad()
			return
		}
		line("state", "window #%d: count %d; the window before it: count %d", f[0], f[1], f[2])
	case "sl":
		var f []int64
		ok := false
		for _, n := range []int{7, 6, 5, 3} { // fewer fields: written by earlier versions
			if f, ok = fields(st.value, n); ok {
				break
			}
		}
		if !ok {
			bad()
			return
		}
		line("state", "log totals: cost %d, last entry #%d admitted %s", f[0], f[1], st.ago(f[2]))
		switch {
		case len(f) >= 5 && f[0] > 0 && f[3] > 0:
			line("oldest", "entry of cost %d admitted %s", f[4], st.ago(f[3]))
		case f[0] > 0:
			line("oldest", "not recorded: the next call looks it up or drops expired entries by score")
		}
		if len(f) >= 6 && f[5] > 0 {
			line("sorted set", "expires %s (its TTL is extended once a Period)", st.ago(f[5]))
		}
		if len(f) == 7 && f[6] == 1 {
			line("costs", "every entry costs 1: expired entries are dropped by score")
		}
	default:
		line("state", "unknown algorithm: raw value only")
	}
}

// printLog explains the sliding log's sorted set: entries "seq:cost"
// scored by the µs they were admitted.
func (st keyState) printLog(line func(string, string, ...any), limit *tierlimit.Limit) {
	if len(st.entries) == 0 {
		line("entries", "none")
		return
	}
	first, last := st.entries[0], st.entries[len(st.entries)-1]
	line("entries", "%d, admitted from %s to %s", len(st.entries), st.ago(int64(first.Score)), st.ago(int64(last.Score)))
	if limit == nil {
		return
	}
	var inWindow int64
	for _, e := range st.entries {
		m, _ := e.Member.(string)
		_, cost, _ := strings.Cut(m, ":")
		if n, err := strconv.ParseInt(cost, 10, 64); err == nil && int64(e.Score) > st.now-limit.PeriodMicros() {
			inWindow += n
		}
	}
	line("now", "%d of %d left in the last %v", max(0, limit.Rate-inWindow), limit.Rate, limit.Period)
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
