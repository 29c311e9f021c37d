package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TokenBucket is a token bucket in Redis: Capacity tokens, refilled at Rate
// per Period, exact in integer arithmetic. It is also the store the hybrid
// tier leases token batches from (Lease, Refund).
//
// A TokenBucket is safe for concurrent use.
type TokenBucket struct{ *limiter }

// NewTokenBucket returns a TokenBucket enforcing limit (and any WithLimits).
// Errors are as for NewGCRA.
func NewTokenBucket(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*TokenBucket, error) {
	l, err := newLimiter(rdb, tokenBucketAlg, limit, opts, 1, 1, 0) // min, want, refund
	if err != nil {
		return nil, err
	}
	return &TokenBucket{l}, nil
}

// AllowN reports whether n tokens may be taken now for key, and takes them
// if so. n == 0 peeks.
func (b *TokenBucket) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if b.observed() {
		return b.observedAllow(ctx, key, n, n, n, 0)
	}
	if err := b.check(key, n); err != nil {
		return tierlimit.Result{}, err
	}
	res, _, err := b.call(ctx, key, n, n, 0)
	return res, err
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (b *TokenBucket) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return b.AllowN(ctx, key, 1)
}

// Claim asks Lease for between Min and Want tokens, after giving back Refund
// unspent ones.
type Claim struct {
	Min    int64 // fewest tokens worth taking; fewer available grants none
	Want   int64 // most tokens to take; Min <= Want <= capacity
	Refund int64 // tokens returned first; 0 <= Refund <= capacity

	// A bucket WithLeaseLedger records what each holder holds, and needs
	// the next three fields (and Refund 0: use Refund to give back); any
	// other bucket needs them zero.
	//
	// Holder names who holds the tokens granted: unique in the fleet
	// (an instance and its lease, say), at most 64 bytes.
	Holder string
	// Gen numbers the holder's claims, increasing (from 1): a Refund names
	// the last one before it.
	Gen int64
	// Held is what the holder still holds of its earlier grants as it
	// claims (at least; >= 0): the ledger lowers its entry to it.
	Held int64
}

// Lease takes between c.Min and c.Want tokens for key in one round trip,
// after refunding c.Refund. It returns the number granted (0 when fewer than
// Min were available) and the Result of the claim: Allowed when granted >=
// Min, with Remaining the tokens left in Redis and RetryAfter the wait until
// Min are available. Granted tokens are debited in Redis before Lease returns.
func (b *TokenBucket) Lease(ctx context.Context, key string, c Claim) (int64, tierlimit.Result, error) {
	if err := b.checkClaim(key, c); err != nil {
		return 0, tierlimit.Result{}, err
	}
	start := b.start()
	res, granted, err := b.run(ctx, key, b.claimArgs(c))
	b.reportCall("claim", start, err)
	return granted, res, err
}

func (b *TokenBucket) checkClaim(key string, c Claim) error {
	if err := b.check(key, c.Want); err != nil {
		return err
	}
	if c.Min < 0 || c.Min > c.Want || c.Refund < 0 || c.Refund > b.maxN {
		return fmt.Errorf("%w: claim %+v needs 0 <= Min <= Want and 0 <= Refund <= %d",
			tierlimit.ErrInvalidCost, c, b.maxN)
	}
	if b.alg.holders && (c.Gen < 1 || c.Held < 0 || c.Refund != 0) {
		return fmt.Errorf("%w: claim %+v on a lease ledger needs Gen >= 1, Held >= 0 and Refund 0",
			tierlimit.ErrInvalidCost, c)
	}
	return b.checkHolder(c.Holder, c.Gen)
}

// maxHolderLen bounds Claim.Holder and Refund.Holder.
const maxHolderLen = 64

// checkHolder checks the holder of a claim or refund: named, with a
// ledger; absent, without.
func (b *TokenBucket) checkHolder(holder string, gen int64) error {
	switch {
	case !b.alg.holders && (holder != "" || gen != 0):
		return fmt.Errorf("%w: remote: holder %q for a bucket without a lease ledger", tierlimit.ErrInvalidKey, holder)
	case b.alg.holders && (holder == "" || len(holder) > maxHolderLen || gen < 0):
		return fmt.Errorf("%w: remote: a lease ledger needs a holder of 1 to %d bytes and Gen >= 0, not %q, %d",
			tierlimit.ErrInvalidKey, maxHolderLen, holder, gen)
	}
	return nil
}

// claimArgs returns the ARGV of claim c.
func (b *TokenBucket) claimArgs(c Claim) []any {
	head := []int64{c.Min, c.Want, c.Refund}
	if !b.alg.holders {
		return b.args(head)
	}
	return b.argsTail(head, []any{c.Gen, c.Held, c.Holder})
}

// Refund gives N unspent tokens back to Key.
type Refund struct {
	Key string
	N   int64 // 0 < N <= capacity
	// ID, if not empty, makes the refund idempotent: Redis applies a
	// refund of a given ID once, however many times it is sent within 30
	// seconds. go-redis resends a command whose connection broke (up to
	// Options.MaxRetries), and a refund that ran before the break must not
	// run twice. Use an ID unique to this refund, at most 64 bytes; it
	// costs a short-lived marker key in Redis.
	ID string
	// Holder and Gen, for a bucket WithLeaseLedger only: the holder giving
	// the tokens back, which then holds none, and the Gen of its last
	// claim before it counted them (a later claim's entry stays).
	Holder string
	Gen    int64
}

// Refund gives tokens back to their buckets, capped at capacity, in one
// pipelined round trip (one per Cluster node). It returns the refunds that
// failed, with the reasons joined in err; the others are applied. Bad input
// fails all of them before any is sent.
func (b *TokenBucket) Refund(ctx context.Context, refunds ...Refund) (failed []Refund, err error) {
	for _, r := range refunds {
		if err := b.check(r.Key, r.N); err != nil {
			return refunds, err
		}
		if len(r.ID) > 64 {
			return refunds, fmt.Errorf("%w: remote: refund ID of %d bytes, more than 64", tierlimit.ErrInvalidKey, len(r.ID))
		}
		if err := b.checkHolder(r.Holder, r.Gen); err != nil {
			return refunds, err
		}
	}
	cmds := b.pipeline(ctx, "refund", len(refunds), func(i int) ([]string, []any) {
		r := &refunds[i]
		keys := b.redisKeys(r.Key)
		if r.ID != "" {
			tag := keyTag(r.Key)
			// '!' after the tag, where every state key has ':': a marker
			// never names the state of any user key.
			keys = append(keys, b.bases[0]+string(tag[:])+"}!"+r.ID)
		}
		head := []int64{0, 0, r.N}
		if !b.alg.holders {
			return keys, b.args(head)
		}
		return keys, b.argsTail(head, []any{r.Gen, -1, r.Holder})
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
// is sent.
func (b *TokenBucket) LeaseBatch(ctx context.Context, keys []string, claims []Claim) []Grant {
	grants := make([]Grant, len(claims))
	for i, c := range claims {
		if err := b.checkClaim(keys[i], c); err != nil {
			for j := range grants {
				grants[j].Err = err
			}
			return grants
		}
	}
	cmds := b.pipeline(ctx, "claim", len(claims), func(i int) ([]string, []any) {
		return b.redisKeys(keys[i]), b.claimArgs(claims[i])
	})
	for i, c := range cmds {
		reply, err := c.Slice()
		if err == nil {
			grants[i].Result, grants[i].Granted, err = b.result(reply)
		}
		grants[i].Err = err
	}
	return grants
}

// pipeline runs the script n times, call i with the Redis keys and ARGV
// that at(i) returns, in one pipeline. A pipeline does not fall back to EVAL by
// itself: the calls the server answered NOSCRIPT are sent again with EVAL,
// and only those, so that none runs twice. The observer sees one call, op,
// with the first error of the calls, if any.
func (b *TokenBucket) pipeline(ctx context.Context, op string, n int, at func(int) ([]string, []any)) []*redis.Cmd {
	start := b.start()
	cmds := b.sendAgain(ctx, n, at)
	if b.onCall != nil {
		var err error
		for _, c := range cmds {
			if err = c.Err(); err != nil {
				break
			}
		}
		b.reportCall(op, start, err)
	}
	return cmds
}

// sendAgain sends the calls, and again with EVAL those answered NOSCRIPT.
func (b *TokenBucket) sendAgain(ctx context.Context, n int, at func(int) ([]string, []any)) []*redis.Cmd {
	cmds := b.send(ctx, n, at, nil)
	var again []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		for j, c := range b.send(ctx, n, at, again) {
			cmds[again[j]] = c
		}
	}
	return cmds
}

// send pipelines the calls with EVALSHA, or with EVAL those at index in only.
func (b *TokenBucket) send(ctx context.Context, n int, at func(int) ([]string, []any), only []int) []*redis.Cmd {
	if only != nil {
		n = len(only)
	}
	cmds := make([]*redis.Cmd, n)
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			run, j := b.alg.script.EvalSha, i
			if only != nil {
				run, j = b.alg.script.Eval, only[i]
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
