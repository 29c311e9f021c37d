package store

// The token bucket's lease protocol, which hybrid builds on: a claim takes
// between Min and Want tokens in one call, a refund gives unspent ones
// back, and with Config.Hold a ledger records what each holder holds.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// Claim asks Lease for between Min and Want tokens, after giving back Refund
// unspent ones.
type Claim struct {
	Min    int64 // fewest tokens worth taking; fewer available grants none
	Want   int64 // most tokens to take; Min <= Want <= capacity
	Refund int64 // tokens returned first; 0 <= Refund <= capacity

	// Limit is the key's limit, for a Limiter serving keys of many limits:
	// the zero Limit means the Limiter's default (New's limit, whatever
	// Config.LimitFunc says). The extras (Config.Extra) apply too. A
	// bucket written under another limit keeps its tokens, capped at this
	// one's capacity.
	Limit tierlimit.Limit

	// A bucket with a ledger (Config.Hold) records what each holder
	// holds, and needs the next three fields (and Refund 0: use Refund to
	// give back); any other bucket needs them zero.
	//
	// Holder names who holds the tokens granted: unique in the fleet
	// (an instance and its lease, say), at most 64 bytes, without ":" or
	// ";".
	Holder string
	// Gen numbers the holder's claims, increasing (from 1): a Refund names
	// the last one before it. A claim with the Gen of the holder's live
	// record is taken for that claim sent again (go-redis resends a
	// command whose connection broke): it is granted what the claim handed
	// out, and nothing is taken twice.
	Gen int64
	// Held is what the holder still holds of its earlier grants as it
	// claims (at least; >= 0): the ledger lowers its entry to it.
	Held int64
	// Orphan, if not 0, is the Gen of the holder's first claim whose call
	// failed without a reply (Redis may have run it), no later claim's
	// reply having come either (each named Orphan too). If one of them ran
	// (its record is live), what the last that ran handed out is granted
	// again by this claim, not taken twice: a reply lost on the way
	// strands no tokens.
	Orphan int64
}

// Lease takes between c.Min and c.Want tokens for key in one round trip,
// after refunding c.Refund. It returns the number granted (0 when fewer than
// Min were available) and the Result of the claim: Allowed when granted >=
// Min, with Remaining the tokens left in Redis and RetryAfter the wait until
// Min are available. Granted tokens are debited in Redis before Lease returns.
func (l *Limiter) Lease(ctx context.Context, key string, c Claim) (int64, tierlimit.Result, error) {
	p, err := l.checkClaim(key, c)
	if err != nil {
		return 0, tierlimit.Result{}, err
	}
	start := l.start()
	res, granted, err := l.run(ctx, l.Keys(key), l.claimArgs(c, p), p.limits)
	l.reportCall("claim", start, err)
	return granted, res, err
}

// checkClaim checks a claim and returns the plan of its limit.
func (l *Limiter) checkClaim(key string, c Claim) (*plan, error) {
	if err := l.checkLease(); err != nil {
		return nil, err
	}
	p, err := l.planFor(c.Limit)
	if err != nil {
		return nil, fmt.Errorf("remote: claim's limit: %w", err)
	}
	if err := p.check(key, c.Want); err != nil {
		return nil, err
	}
	if c.Min < 0 || c.Min > c.Want || c.Refund < 0 || c.Refund > p.maxN {
		return nil, fmt.Errorf("%w: claim %+v needs 0 <= Min <= Want and 0 <= Refund <= %d",
			tierlimit.ErrInvalidCost, c, p.maxN)
	}
	if c.peek() {
		return p, nil
	}
	if l.alg.holders && (c.Gen < 1 || c.Held < 0 || c.Refund != 0 || c.Orphan < 0 || c.Orphan >= c.Gen) {
		return nil, fmt.Errorf("%w: claim %+v on a lease ledger needs Gen >= 1, Held >= 0, Refund 0 and 0 <= Orphan < Gen",
			tierlimit.ErrInvalidCost, c)
	}
	if !l.alg.holders && c.Orphan != 0 {
		return nil, fmt.Errorf("%w: remote: an orphan claim for a bucket without a lease ledger", tierlimit.ErrInvalidCost)
	}
	return p, l.checkHolder(c.Holder, c.Gen)
}

// peek reports whether c only reads the bucket: it wants nothing, gives
// nothing back and names no holder, on a ledger or not.
func (c Claim) peek() bool {
	return c.Want == 0 && c.Refund == 0 && c.Holder == "" && c.Gen == 0 && c.Held == 0 && c.Orphan == 0
}

// errNoLease is returned by Lease, LeaseBatch and Refund on an algorithm
// other than the token bucket.
var errNoLease = fmt.Errorf("%w: remote: only a token bucket leases", tierlimit.ErrInvalidOption)

func (l *Limiter) checkLease() error {
	if !l.alg.lease {
		return errNoLease
	}
	return nil
}

// maxHolderLen bounds Claim.Holder and Refund.Holder.
const maxHolderLen = 64

// checkHolder checks the holder of a claim or refund: named, with a
// ledger; absent, without. A holder has no ':' or ';', which spell the
// ledger's records (ledger.lua).
func (l *Limiter) checkHolder(holder string, gen int64) error {
	switch {
	case !l.alg.holders && (holder != "" || gen != 0):
		return fmt.Errorf("%w: remote: holder %q for a bucket without a lease ledger", tierlimit.ErrInvalidKey, holder)
	case l.alg.holders && (holder == "" || len(holder) > maxHolderLen || strings.ContainsAny(holder, ":;") || gen < 0):
		return fmt.Errorf("%w: remote: a lease ledger needs a holder of 1 to %d bytes without ':' or ';', and Gen >= 0, not %q, %d",
			tierlimit.ErrInvalidKey, maxHolderLen, holder, gen)
	}
	return nil
}

// claimArgs returns the ARGV of claim c under p.
func (l *Limiter) claimArgs(c Claim, p *plan) []any {
	if l.alg.holders {
		gen, held, holder := c.holding()
		return l.ledgerArgs(c, p, gen, held, holder)
	}
	return l.args(modeDecide, c.Want, c.Refund, p, c.Min)
}

// holding returns the gen, held and holder ledger.lua is told of claim c:
// a peek's are those of a call that holds nothing.
func (c Claim) holding() (gen, held int64, holder string) {
	if c.peek() {
		return 0, -1, ""
	}
	return c.Gen, c.Held, c.Holder
}

// ledgerArgs returns the ARGV of ledger.lua for claim c's Min, Want and
// Refund under p, by holder: p's first limit's spec in ARGV[5], the
// others' after the orphan.
func (l *Limiter) ledgerArgs(c Claim, p *plan, gen, held int64, holder string) []any {
	args := make([]any, 0, 9+len(p.specs))
	args = append(args, l.now(), c.Min, c.Want, c.Refund, p.specs[0], l.hold, gen, held, holder, c.Orphan)
	for _, spec := range p.specs[1:] {
		args = append(args, spec)
	}
	return args
}

// Refund gives N unspent tokens back to Key.
type Refund struct {
	Key string
	N   int64 // 0 < N <= capacity
	// Limit is the key's limit, as Claim.Limit: the zero Limit means the
	// Limiter's default. The bucket is filled up to its capacity at most.
	Limit tierlimit.Limit
	// ID, if not empty, makes the refund idempotent: Redis applies a
	// refund of a given ID once, however many times it is sent within 30
	// seconds. go-redis resends a command whose connection broke (up to
	// Options.MaxRetries), and a refund that ran before the break must not
	// run twice. Use an ID unique to this refund, at most 64 bytes; it
	// costs a short-lived marker key in Redis.
	ID string
	// Holder and Gen, for a bucket with a ledger only: the holder giving
	// the tokens back, which then holds none, and the Gen of its last
	// claim before it counted them (a later claim's entry stays).
	Holder string
	Gen    int64
	// Orphan, for a bucket with a ledger only, as Claim's: the grant of
	// the holder's claim Orphan, if it ran, is given back too. N may then
	// be 0.
	Orphan int64
}

// Refund gives tokens back to their buckets, capped at capacity, in one
// pipelined round trip (one per Cluster node). It returns the refunds that
// failed, with the reasons joined in err; the others are applied. Bad input
// fails all of them before any is sent.
func (l *Limiter) Refund(ctx context.Context, refunds ...Refund) (failed []Refund, err error) {
	if err := l.checkLease(); err != nil {
		return refunds, err
	}
	plans := make([]*plan, len(refunds))
	for i, r := range refunds {
		p, err := l.planFor(r.Limit)
		if err != nil {
			return refunds, fmt.Errorf("remote: refund's limit: %w", err)
		}
		if r.N == 0 && r.Orphan > 0 && l.alg.holders {
			err = p.check(r.Key, 1) // an orphan's grant only: the key's check
		} else {
			err = p.check(r.Key, r.N)
		}
		if err != nil {
			return refunds, err
		}
		if r.Orphan < 0 || r.Orphan > r.Gen || (!l.alg.holders && r.Orphan != 0) {
			return refunds, fmt.Errorf("%w: remote: refund %+v needs 0 <= Orphan <= Gen, and a ledger for an orphan",
				tierlimit.ErrInvalidCost, r)
		}
		plans[i] = p
		if len(r.ID) > 64 {
			return refunds, fmt.Errorf("%w: remote: refund ID of %d bytes, more than 64", tierlimit.ErrInvalidKey, len(r.ID))
		}
		if err := l.checkHolder(r.Holder, r.Gen); err != nil {
			return refunds, err
		}
	}
	cmds := l.pipeline(ctx, "refund", len(refunds), func(i int) ([]string, []any) {
		r := &refunds[i]
		keys := l.Keys(r.Key)
		if r.ID != "" {
			tag := keyTag(r.Key)
			// '!' after the tag, where every state key has ':': a marker
			// never names the state of any user key.
			keys = append(keys, l.bases[0]+string(tag[:])+"}!"+r.ID)
		}
		if !l.alg.holders {
			return keys, l.args(modeDecide, 0, r.N, plans[i], 0)
		}
		return keys, l.ledgerArgs(Claim{Refund: r.N, Orphan: r.Orphan}, plans[i], r.Gen, -1, r.Holder)
	})
	var errs []error
	for i, c := range cmds {
		if c.Err() != nil {
			failed = append(failed, refunds[i])
			errs = append(errs, fmt.Errorf("remote: refund %d to %q: %w", refunds[i].N, refunds[i].Key, c.Err()))
		}
	}
	return failed, errors.Join(errs...)
}

// Grant is the outcome of one claim of LeaseBatch.
type Grant struct {
	Granted int64
	Result  tierlimit.Result
	Err     error // this claim failed; nothing was taken
}

// LeaseBatch runs claims[i] for keys[i], as Lease does, in one pipelined
// round trip (one per Cluster node). Bad input fails every claim before any
// is sent. On a lease ledger the claims of one slot (all of them on a
// single Redis) run in one script call, up to batchMax of them: Redis runs
// the script's setup once for them all. Its error, if any, is every
// claim's.
func (l *Limiter) LeaseBatch(ctx context.Context, keys []string, claims []Claim) []Grant {
	grants := make([]Grant, len(claims))
	plans := make([]*plan, len(claims))
	for i, c := range claims {
		p, err := l.checkClaim(keys[i], c)
		if err != nil {
			for j := range grants {
				grants[j].Err = err
			}
			return grants
		}
		plans[i] = p
	}
	if l.alg.holders {
		l.leaseBatched(ctx, keys, claims, plans, grants)
		return grants
	}
	cmds := l.pipeline(ctx, "claim", len(claims), func(i int) ([]string, []any) {
		return l.Keys(keys[i]), l.claimArgs(claims[i], plans[i])
	})
	for i, c := range cmds {
		reply, err := c.Slice()
		if err == nil {
			grants[i].Result, grants[i].Granted, err = l.result(reply, plans[i].limits)
		}
		grants[i].Err = err
	}
	return grants
}

// batchMax bounds the claims of one batched script call.
const batchMax = 256

// leaseBatched runs LeaseBatch's claims on a lease ledger, in batches of
// one slot each (ledger.lua's batch mode), pipelined, and fills grants.
func (l *Limiter) leaseBatched(ctx context.Context, keys []string, claims []Claim, plans []*plan, grants []Grant) {
	var batches [][]int   // claim indexes
	open := map[int]int{} // slot -> its batch being filled
	for i := range claims {
		slot := 0
		if l.cluster {
			tag := keyTag(keys[i])
			slot = slotOf(string(tag[:]))
		}
		b, ok := open[slot]
		if !ok || len(batches[b]) == batchMax {
			b = len(batches)
			batches = append(batches, nil)
			open[slot] = b
		}
		batches[b] = append(batches[b], i)
	}
	cmds := l.pipeline(ctx, "claim", len(batches), func(b int) ([]string, []any) {
		ks := make([]string, 0, len(batches[b])*len(l.bases))
		args := make([]any, 0, 3+8*len(batches[b]))
		args = append(args, l.now(), "batch", l.hold)
		for _, i := range batches[b] {
			c, p := claims[i], plans[i]
			ks = l.appendKeys(ks, keys[i])
			gen, held, holder := c.holding()
			args = append(args, len(p.specs), c.Min, c.Want, gen, held, holder, c.Orphan)
			for _, spec := range p.specs {
				args = append(args, spec)
			}
		}
		return ks, args
	})
	for b, cmd := range cmds {
		replies, err := cmd.Slice()
		if err == nil && len(replies) != len(batches[b]) {
			err = fmt.Errorf("remote: %s: batch reply of %d claims, want %d", l.alg.name, len(replies), len(batches[b]))
		}
		for j, i := range batches[b] {
			if err != nil {
				grants[i].Err = err
				continue
			}
			reply, ok := replies[j].([]any)
			if !ok {
				grants[i].Err = fmt.Errorf("remote: %s: batch reply %d is %T", l.alg.name, j, replies[j])
				continue
			}
			grants[i].Result, grants[i].Granted, grants[i].Err = l.result(reply, plans[i].limits)
		}
	}
}

// pipeline runs the script n times, call i with the Redis keys and ARGV
// that at(i) returns, in one pipeline. A pipeline does not fall back to EVAL by
// itself: the calls the server answered NOSCRIPT are sent again with EVAL,
// and only those, so that none runs twice. The observer sees one call, op,
// with the first error of the calls, if any.
func (l *Limiter) pipeline(ctx context.Context, op string, n int, at func(int) ([]string, []any)) []*redis.Cmd {
	start := l.start()
	cmds := l.sendAgain(ctx, l.alg.script, n, at)
	if l.onCall != nil {
		var err error
		for _, c := range cmds {
			if err = c.Err(); err != nil {
				break
			}
		}
		l.reportCall(op, start, err)
	}
	return cmds
}

// sendAgain sends the calls of script, and again with EVAL those answered
// NOSCRIPT.
func (l *Limiter) sendAgain(ctx context.Context, script *redis.Script, n int, at func(int) ([]string, []any)) []*redis.Cmd {
	cmds := l.send(ctx, script, n, at, nil)
	var again []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		for j, c := range l.send(ctx, script, n, at, again) {
			cmds[again[j]] = c
		}
	}
	return cmds
}

// send pipelines the calls of script with EVALSHA, or with EVAL those at
// index in only.
func (l *Limiter) send(ctx context.Context, script *redis.Script, n int, at func(int) ([]string, []any), only []int) []*redis.Cmd {
	if only != nil {
		n = len(only)
	}
	cmds := make([]*redis.Cmd, n)
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			run, j := script.EvalSha, i
			if only != nil {
				run, j = script.Eval, only[i]
			}
			keys, args := at(j)
			cmds[i] = run(ctx, p, keys, args...)
		}
		return nil
	})
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
