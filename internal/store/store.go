// Package store runs tierlimit's Lua scripts (package lua, compiled by internal/script) against Redis:
// it names the Redis keys of a user key, builds each script's ARGV, reads
// its reply into a tierlimit.Result, and speaks the token bucket's lease
// protocol (Lease, LeaseBatch, Refund, the ledger of Config.Hold). remote
// wraps a Limiter in each of its public limiters; hybrid leases through
// one; cmd/tierlimit reads keys by the names Keys gives.
package store

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/logline"
	"github.com/tierlimit/tierlimit/internal/perlimit"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/evict"
)

// Limiter runs one algorithm's script for some limits: key naming,
// argument building, the script call and the reply. It is safe for
// concurrent use.
//
// A key is decided under its limits, one entry each: position 0 holds the
// default limit (New's) or, with Config.LimitFunc, the key's own; 1.. hold
// Config.Extra. A limit's Redis keys are named by its position, and its
// state records the limit it was written under (docs/operations.md).
type Limiter struct {
	rdb   redis.UniversalClient
	alg   *Algorithm
	def   *plan        // the default limit and the extras
	fn    check.Lookup // not Set: every key has the default
	bases []string     // per position: prefix, algorithm, position, up to the hash tag
	clock tierlimit.Clock
	hold  int64 // a ledger's hold in µs (Config.Hold)

	// cluster: keys in different slots need calls of their own (AllowAll).
	cluster bool

	// plans caches the plans of LimitFunc's answers (and Claim.Limit's).
	plans perlimit.Cache[*plan]

	// The observer's funcs (WithObserver), nil when not observed: the
	// unobserved path reads no clock.
	onDecision func(tierlimit.Decision)
	onCall     func(tierlimit.RedisCall)
	onGiveBack func(tierlimit.GiveBack)

	// watch follows the server's eviction settings: read at New, again
	// about once a minute from a call's goroutine.
	watch *evict.Watch

	// oneArgs is the ARGV of the most common call (server clock, n = 1,
	// the default limits), built once: go-redis copies ARGV and never
	// changes it, so every call may share it.
	oneArgs []any
}

// New returns a Limiter of alg for limit (and cfg.Extra). It returns an
// error wrapping tierlimit.ErrInvalidLimit for a bad limit and
// tierlimit.ErrInvalidOption for a nil client (a typed nil *redis.Client
// too) or a bad cfg. It reads the server's eviction settings (Eviction),
// waiting at most NewTimeout: a Redis that does not answer by then is
// logged (log/slog) in plain words, and New returns the Limiter anyway.
func New(rdb redis.UniversalClient, alg *Algorithm, limit tierlimit.Limit, cfg Config) (*Limiter, error) {
	if evict.NilClient(rdb) {
		return nil, fmt.Errorf("%w: nil redis client (%T)", tierlimit.ErrInvalidOption, rdb)
	}
	l, err := build(alg, limit, cfg)
	if err != nil {
		return nil, err
	}
	l.rdb = rdb
	_, l.cluster = rdb.(*redis.ClusterClient)
	var onEviction func(tierlimit.EvictionRisk)
	if o := cfg.Observer; o != nil {
		l.onDecision, l.onCall, l.onGiveBack, onEviction = o.Decision, o.RedisCall, o.GiveBack, o.Eviction
	}
	l.watch = evict.NewWatch(rdb, onEviction, cfg.Logger)
	ctx, cancel := context.WithTimeout(context.Background(), NewTimeout)
	defer cancel()
	if _, err := l.watch.Check(ctx); errors.Is(err, tierlimit.ErrMisconfigured) {
		return nil, err
	} else if err != nil {
		logline.Or(cfg.Logger).Warn(unreachable(rdb, err))
	}
	return l, nil
}

// NewTimeout bounds what New waits for Redis: its one call, a reading of
// the server's eviction settings. It is short because nothing depends on
// that reading but Eviction's answer (which a later call reads again),
// and a process that starts while Redis is down must not stall on each
// limiter it builds, whatever go-redis's dial timeouts and retries.
const NewTimeout = 250 * time.Millisecond

// unreachable says in plain words that rdb did not answer New, with err,
// the error that kept it from answering.
func unreachable(rdb redis.UniversalClient, err error) string {
	what := "did not answer"
	if errors.Is(err, context.DeadlineExceeded) {
		what = fmt.Sprintf("did not answer within %v", NewTimeout)
	}
	return fmt.Sprintf("tierlimit: redis at %s %s while a limiter was made (%v): the limiter is made anyway "+
		"and asks redis again on its calls; until redis answers, whether it may evict limiter keys is unknown",
		addrOf(rdb), what, err)
}

// addrOf returns the addresses rdb connects to, for a log line.
func addrOf(rdb redis.UniversalClient) string {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		addrs := make([]string, 0, len(c.Options().Addrs))
		for _, a := range c.Options().Addrs {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
		return strings.Join(addrs, ",")
	}
	return fmt.Sprintf("%T", rdb)
}

// KeysOf returns the Redis keys, in script order, that a Limiter of alg,
// limit and cfg uses for key: what New(rdb, alg, limit, cfg).Keys(key)
// returns, without a client. Errors are New's, and ErrInvalidKey.
func KeysOf(alg *Algorithm, limit tierlimit.Limit, cfg Config, key string) ([]string, error) {
	l, err := build(alg, limit, cfg)
	if err != nil {
		return nil, err
	}
	if err := check.Key(key); err != nil {
		return nil, err
	}
	return l.Keys(key), nil
}

// build checks cfg and the limits, and lays out a Limiter's keys and ARGV.
func build(alg *Algorithm, limit tierlimit.Limit, cfg Config) (*Limiter, error) {
	if err := cfg.check(alg); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Hold != 0 {
		alg = ledger()
	}
	fn, err := check.NewLookup(cfg.LimitFunc, cfg.LimitLookup, cfg.LookupFailOpen)
	if err != nil {
		return nil, err
	}
	l := &Limiter{alg: alg, clock: cfg.Clock, fn: fn, hold: cfg.Hold.Microseconds()}
	limits := append([]tierlimit.Limit{limit}, cfg.Extra...)
	for i, lim := range limits {
		if err := alg.check(lim); err != nil {
			return nil, err
		}
		l.bases = append(l.bases, cfg.Prefix+alg.name+":"+strconv.Itoa(i)+":{")
	}
	l.def = l.newPlan(limits)
	if !alg.ledger {
		l.oneArgs = l.args(modeDecide, l.def, 1)
	}
	return l, nil
}

// check reports whether lim is a valid limit for the algorithm: an error
// wrapping tierlimit.ErrInvalidLimit if not.
func (a *Algorithm) check(lim tierlimit.Limit) error {
	if err := lim.Validate(); err != nil {
		return fmt.Errorf("%w (%s)", err, a.name)
	}
	if a.validate != nil {
		if err := a.validate(lim); err != nil {
			return fmt.Errorf("%w (%s)", err, a.name)
		}
	}
	return nil
}

// Load loads the limiter's script into Redis's script cache (every master
// of a Cluster), so that the first call finds it by its SHA instead of
// sending and compiling it within that call's time.
func (l *Limiter) Load(ctx context.Context) error {
	return l.alg.script.Load(ctx, l.rdb).Err()
}

// evictionCheckTimeout bounds a reading of the server's eviction settings.
const evictionCheckTimeout = time.Second

// Eviction returns what the Redis server said about evicting keys when last
// read: at New, then about once a minute while the limiter is used.
func (l *Limiter) Eviction() tierlimit.EvictionRisk { return l.watch.Last() }

// checkEviction reads the eviction settings again on a goroutine of its
// own (bounded by evictionCheckTimeout) when they are due.
func (l *Limiter) checkEviction() {
	if !l.watch.Due(time.Now()) {
		return
	}
	go func() {
		defer l.watch.Done()
		ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
		defer cancel()
		// A silent Redis leaves the last reading standing: the calls
		// that fail meanwhile return their own errors.
		l.watch.Check(ctx)
	}()
}

// Misconfigured is tierlimit.Misconfigured for the server behind l: an OOM
// reply of a server whose maxmemory-policy evicts keys (see
// tierlimit.EvictionRisk.Risky) is memory pressure that passes as Redis
// evicts, not a misconfiguration; under noeviction, or an unknown policy,
// it is one.
func (l *Limiter) Misconfigured(err error) bool {
	if l.wrongTopology(err) {
		return true
	}
	if !tierlimit.Misconfigured(err) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "OOM ") && !errors.Is(err, tierlimit.ErrMisconfigured) {
		return !l.Eviction().Risky()
	}
	return true
}

// wrongTopology reports whether err is a reply that a client of another
// kind would not get: a redirection (MOVED, ASK) or CROSSSLOT to a client
// that is not a Cluster client (it is on a Cluster node), or "cluster
// support disabled" to a Cluster client (on a standalone server). A
// Cluster client follows redirections itself.
func (l *Limiter) wrongTopology(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	if _, cluster := l.rdb.(*redis.ClusterClient); cluster {
		return strings.Contains(msg, "cluster support disabled")
	}
	for _, p := range []string{"MOVED ", "ASK ", "CROSSSLOT "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// redisErr wraps an error of a Redis call made for op: with
// tierlimit.ErrMisconfigured too when Redis refuses the limiter's commands.
func (l *Limiter) redisErr(op string, err error) error {
	if l.Misconfigured(err) {
		return fmt.Errorf("%s: %w: %w", op, tierlimit.ErrMisconfigured, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// The scripts' modes (ARGV[2]): decide all-or-nothing, settle, or grant
// part (AllowAtMost).
const (
	modeDecide  = "0"
	modeSettle  = "1"
	modePartial = "2"
)

// args builds the ARGV of a call over the entries of one key under p,
// each of cost n.
func (l *Limiter) args(mode string, p *plan, n int64) []any {
	args := l.head(mode, len(p.limits))
	for _, spec := range p.specs {
		args = append(args, n, spec)
	}
	return args
}

// head returns the ARGV up to the entries, with room for entries of them.
func (l *Limiter) head(mode string, entries int) []any {
	return append(make([]any, 0, 2+2*entries), l.now(), mode)
}

// keyTag is the Cluster hash tag of a user key: a hash, so that no byte of the
// key can move or split its slot.
func keyTag(key string) [16]byte {
	var sum [8]byte
	h := xxhash.Sum64String(key)
	for i := range sum {
		sum[i] = byte(h >> (56 - 8*i))
	}
	var tag [16]byte
	hex.Encode(tag[:], sum[:])
	return tag
}

// Keys returns the Redis keys of a user key, in script order: for each
// limit by position, the algorithm's keys. It does not check the key.
func (l *Limiter) Keys(key string) []string {
	return l.appendKeys(make([]string, 0, len(l.bases)*len(l.alg.keys)), key)
}

// appendKeys appends the Redis keys of a user key to keys.
func (l *Limiter) appendKeys(keys []string, key string) []string {
	tag := keyTag(key)
	for _, b := range l.bases {
		for _, s := range l.alg.keys {
			keys = append(keys, b+string(tag[:])+"}:"+key+s)
		}
	}
	return keys
}

// now returns the client clock in µs for ARGV[1], or 0 for the server's TIME.
func (l *Limiter) now() int64 {
	if l.clock == nil {
		return 0
	}
	return l.clock.Now().UnixMicro()
}

// AllowN reports whether n events may happen now for key, and charges them
// if so. n == 0 peeks: it charges nothing and is allowed, with Remaining
// telling what is left, but on a token bucket or GCRA key in debt
// (Settle), where it is denied with the wait until the debt is repaid. A key Config.LimitFunc blocks is denied
// (blockedResult), peeks too, without a call.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if l.observed() {
		return l.observedAllow(ctx, key, n)
	}
	res, _, err := l.call(ctx, key, n)
	return res, err
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// Reset forgets key's state under every limit: the key is back to full capacity.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := check.Key(key); err != nil {
		return err
	}
	start := l.start()
	err := l.rdb.Del(ctx, l.Keys(key)...).Err()
	l.reportCall("reset", start, err)
	if err != nil {
		return l.redisErr("reset", err)
	}
	return nil
}

// call decides a cost of n for key and returns the result, and the tokens
// granted.
func (l *Limiter) call(ctx context.Context, key string, n int64) (tierlimit.Result, int64, error) {
	p, err := l.prepare(key, n)
	switch {
	case err != nil:
		return tierlimit.Result{}, 0, err
	case p == blockedPlan:
		return blockedResult, 0, nil
	}
	return l.decide(ctx, key, p, n)
}

// decide decides a cost of n, checked, for key under p.
func (l *Limiter) decide(ctx context.Context, key string, p *plan, n int64) (tierlimit.Result, int64, error) {
	var args []any
	switch {
	case l.alg.ledger:
		args = l.takeArgs(n, p)
	case p == l.def && l.clock == nil && n == 1:
		args = l.oneArgs
	default:
		args = l.args(modeDecide, p, n)
	}
	return l.run(ctx, l.Keys(key), args, p.limits)
}

// run runs the script on keys with ARGV args; limits are the entries'.
func (l *Limiter) run(ctx context.Context, keys []string, args []any, limits []tierlimit.Limit) (tierlimit.Result, int64, error) {
	g := l.runGrant(ctx, keys, args, limits)
	return g.Result, g.Granted, g.Err
}

// runGrant is run, with the whole outcome.
func (l *Limiter) runGrant(ctx context.Context, keys []string, args []any, limits []tierlimit.Limit) Grant {
	l.checkEviction()
	reply, err := l.alg.script.Run(ctx, l.rdb, keys, args...).Slice()
	if err != nil {
		return Grant{Err: l.redisErr(l.alg.name, err)}
	}
	return l.result(reply, limits)
}

// replyLen is the length of a script's reply to one call under limits:
// allowed, handed, then remaining, retry and reset per limit, then, from
// ledger.lua, full and cut.
func (l *Limiter) replyLen(limits []tierlimit.Limit) int {
	n := 2 + 3*len(limits)
	if l.alg.ledger {
		n += 2
	}
	return n
}

// result folds a script reply {allowed, granted, per entry: remaining,
// retry_us, reset_us, then full (ledger.lua)} into one Grant: the most
// restrictive entry decides the Result.
func (l *Limiter) result(reply []any, limits []tierlimit.Limit) Grant {
	if len(reply) != l.replyLen(limits) {
		return Grant{Err: fmt.Errorf("%s: reply of %d values, want %d",
			l.alg.name, len(reply), l.replyLen(limits))}
	}
	at := func(i int) int64 {
		v, _ := reply[i].(int64) // the scripts reply integers only
		return v
	}
	res := tierlimit.Result{Allowed: at(0) == 1, Source: tierlimit.SourceRemote, Remaining: -1}
	var worstRetry int64 = -1
	for i, lim := range limits {
		rem := min(max(at(2+3*i), 0), l.alg.capacity(lim))
		retry, reset := max(at(3+3*i), 0), max(at(4+3*i), 0)
		if res.Allowed && (res.Remaining < 0 || rem < res.Remaining) {
			res.Limit = lim
		}
		if !res.Allowed && retry > worstRetry {
			worstRetry = retry
			res.Limit = lim
			res.RetryAfter = micros(retry)
		}
		if res.Remaining < 0 || rem < res.Remaining {
			res.Remaining = rem
		}
		res.ResetAfter = max(res.ResetAfter, micros(reset))
	}
	g := Grant{Granted: at(1), Result: res}
	if l.alg.ledger {
		g.Full, g.Result.Uncharged = at(len(reply)-2) == 1, at(len(reply)-1)
	}
	return g
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
