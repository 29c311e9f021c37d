package store

// The token bucket's lease protocol, which hybrid builds on, on a bucket
// with a ledger (Config.Hold): a claim takes between Min and Want tokens
// in one call, a refund gives unspent ones back, and the ledger records
// what each holder holds.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Claim asks Lease for between Min and Want tokens.
type Claim struct {
	Min  int64 // fewest tokens worth taking; fewer available grants none
	Want int64 // most tokens to take; Min <= Want <= capacity

	// Limit is the key's limit, for a Limiter serving keys of many limits:
	// the zero Limit means the Limiter's default (New's limit, whatever
	// Config.LimitFunc says). The extras (Config.Extra) apply too. A
	// bucket written under another limit keeps its tokens, capped at this
	// one's capacity.
	Limit tierlimit.Limit

	// The ledger records what each holder holds, and needs the next
	// fields, all zero for a peek (Want 0).
	//
	// Holder names who holds the tokens granted: unique in the fleet
	// (an instance and its lease, say), at most 64 bytes, without ":" or
	// ";".
	Holder string
	// Gen numbers the holder's claims and refunds, increasing (from 1),
	// in the order it makes them. A claim with the Gen of the holder's
	// record is taken for that claim sent again (go-redis resends a
	// command whose connection broke): it takes nothing fresh. A call
	// with a lower Gen than the record's ran after a later call of the
	// holder, and does nothing.
	Gen int64
	// Held is what the holder still holds of its earlier grants as it
	// claims (at least; >= 0): the ledger lowers its record to it.
	Held int64
	// Received is the total the holder's replies have granted it so far
	// (>= 0). The ledger counts the total it handed the holder: what the
	// holder never received (replies lost on the way) is granted again by
	// this claim, with any fresh tokens, and taken nothing twice.
	Received int64
	// Live says that the holder's record should be live: a grant reached
	// the holder less than a lease TTL ago (well within the ledger's
	// hold) and no refund ended the record since. A key Redis no longer
	// has then lost its state (flushed, evicted, a restart from empty):
	// its bucket starts again empty, not full (G1).
	Live bool
	// Debt takes what the bucket lacks of Want all the same (Min must be
	// 0): the level goes below empty, down to minus the capacity at most,
	// and the key is denied until the refill has repaid it. Only the
	// tokens the level held are granted (and recorded as held); the rest
	// are the level's debt, and what the floor cuts off is the Result's
	// Uncharged. Settle's take: the events it settles happened, so its
	// Want may pass the capacity (the script is sent at most twice the
	// largest, which no level can take more of).
	Debt bool
}

// Lease takes between c.Min and c.Want tokens for key in one round trip.
// It returns the number granted (0 when fewer than
// Min were available) and the Result of the claim: Allowed when granted >=
// Min, with Remaining the tokens left in Redis and RetryAfter the wait until
// Min are available. Granted tokens are debited in Redis before Lease returns.
func (l *Limiter) Lease(ctx context.Context, key string, c Claim) (int64, tierlimit.Result, error) {
	g := l.LeaseGrant(ctx, key, c)
	return g.Granted, g.Result, g.Err
}

// LeaseGrant is Lease, with the whole outcome (Grant.Full).
func (l *Limiter) LeaseGrant(ctx context.Context, key string, c Claim) Grant {
	p, err := l.checkClaim(key, c)
	if err != nil {
		return Grant{Err: err}
	}
	start := l.start()
	g := l.runGrant(ctx, l.Keys(key), l.claimArgs(c, p), p.limits)
	l.reportCall("claim", start, g.Err)
	if g.Err == nil {
		g.Result.Uncharged += c.Want - l.sent(c, p)
	}
	return g
}

// sent is the Want of claim c that ledger.lua is sent: a debt claim's at
// most twice the largest capacity of p's limits (from full to the floor),
// which keeps the script's arithmetic exact; what it could not have taken
// anyway is uncharged.
func (l *Limiter) sent(c Claim, p *plan) int64 {
	if !c.Debt {
		return c.Want
	}
	most := int64(0)
	for _, lim := range p.limits {
		most = max(most, 2*l.alg.capacity(lim))
	}
	return min(c.Want, most)
}

// checkClaim checks a claim and returns the plan of its limit.
func (l *Limiter) checkClaim(key string, c Claim) (*plan, error) {
	if err := l.checkLease(); err != nil {
		return nil, err
	}
	p, err := l.planFor(c.Limit)
	if err != nil {
		return nil, fmt.Errorf("%w (the claim's limit)", err)
	}
	if c.Debt && c.Want > p.maxN {
		if err := p.check(key, 0); err != nil {
			return nil, err
		}
	} else if err := p.check(key, c.Want); err != nil {
		return nil, err
	}
	if c.Min < 0 || c.Min > c.Want || c.Debt && c.Min != 0 {
		return nil, fmt.Errorf("%w: claim %+v needs 0 <= Min <= Want, and Min 0 for a debt", tierlimit.ErrInvalidCost, c)
	}
	if c.peek() {
		return p, nil
	}
	if c.Gen < 1 || c.Held < 0 || c.Received < 0 {
		return nil, fmt.Errorf("%w: claim %+v needs Gen >= 1, Held >= 0 and Received >= 0",
			tierlimit.ErrInvalidCost, c)
	}
	return p, checkHolder(c.Holder, c.Gen)
}

// peek reports whether c only reads the bucket: it wants nothing and
// names no holder.
func (c Claim) peek() bool {
	return c.Want == 0 && c.Holder == "" && c.Gen == 0 && c.Held == 0 && c.Received == 0 && !c.Live && !c.Debt
}

// errNoLease is returned by Lease, LeaseBatch and Refund on a Limiter
// without a lease ledger (Config.Hold).
var errNoLease = fmt.Errorf("%w: only a token bucket with a lease ledger leases", tierlimit.ErrInvalidOption)

func (l *Limiter) checkLease() error {
	if !l.alg.ledger {
		return errNoLease
	}
	return nil
}

// maxHolderLen bounds Claim.Holder and Refund.Holder.
const maxHolderLen = 64

// checkHolder checks the holder of a claim or refund. A holder has no ':'
// or ';', which spell the ledger's records (ledger.lua).
func checkHolder(holder string, gen int64) error {
	if holder == "" || len(holder) > maxHolderLen || strings.ContainsAny(holder, ":;") || gen < 0 {
		return fmt.Errorf("%w: a lease ledger needs a holder of 1 to %d bytes without ':' or ';', and Gen >= 0, not %q, %d",
			tierlimit.ErrInvalidKey, maxHolderLen, holder, gen)
	}
	return nil
}

// claimArgs returns the ARGV of claim c under p.
func (l *Limiter) claimArgs(c Claim, p *plan) []any {
	return l.ledgerCall(append(make([]any, 0, 12+len(p.specs)), l.now(), l.hold), c, p)
}

// ledgerCall appends to args the fields of claim c under p as ledger.lua
// reads one call: a holder's claim, or a take of no holder's (a peek).
func (l *Limiter) ledgerCall(args []any, c Claim, p *plan) []any {
	if c.peek() {
		args = append(args, "take", len(p.specs), 0, 0)
	} else {
		args = append(args, "claim", len(p.specs), c.Min, l.sent(c, p), c.Gen, c.Held, c.Received, flag(c.Live), flag(c.Debt), c.Holder)
	}
	for _, spec := range p.specs {
		args = append(args, spec)
	}
	return args
}

// flag is a bool as ledger.lua reads one.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// takeArgs returns the ARGV of ledger.lua for a take of n tokens under p,
// no holder's (AllowN).
func (l *Limiter) takeArgs(n int64, p *plan) []any {
	args := make([]any, 0, 6+len(p.specs))
	args = append(args, l.now(), l.hold, "take", len(p.specs), n, n)
	for _, spec := range p.specs {
		args = append(args, spec)
	}
	return args
}

// Refund gives N unspent tokens back to Key.
type Refund struct {
	Key string
	N   int64 // leased tokens given back, 0 <= N <= tierlimit.MaxRate (the ledger takes back at most the holder's record)
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
	// Holder, Gen and Received: the holder giving the tokens back, which then holds none; the number of
	// this refund (as Claim.Gen: after every claim of the holder's made
	// before it); the total the holder's replies granted it (as
	// Claim.Received). The ledger takes N, and what replies the holder
	// never got handed it, back from the holder's live record, at most
	// what that holds, and ends it; without a live record of an earlier
	// Gen (it passed its deadline, or a later claim ran first) it gives
	// none of N back: the bucket has taken them back already. N may then
	// be 0.
	Holder   string
	Gen      int64
	Received int64
	// Live, as Claim.Live.
	Live bool
	// Spent: tokens spent that are given back all the same (hybrid's
	// Settle), taken back whatever the ledger holds, up to capacity.
	Spent int64
}

// Refund gives tokens back to their buckets, capped at capacity, in one
// pipelined round trip (one per Cluster node). It returns the refunds that
// failed, with the reasons joined in err; the others are applied. Bad input
// fails all of them before any is sent. failed also holds,
// with a nil err, the part of a refund's N that the ledger did not take
// back because the holder's record had ended (a refund that arrived past
// its record's deadline, or after a later claim): those tokens stay
// debited until the bucket refills them, and a refund sent again after a
// broken connection reads as giving none back.
func (l *Limiter) Refund(ctx context.Context, refunds ...Refund) (failed []Refund, err error) {
	outs, err := l.RefundEach(ctx, refunds...)
	if outs == nil {
		return refunds, err
	}
	for i, o := range outs {
		switch r := refunds[i]; {
		case o.Err != nil:
			failed = append(failed, r)
		case o.Took < r.N:
			// The ledger took back what the holder's live record held:
			// the rest stays debited until the level refills it.
			failed = append(failed, Refund{Key: r.Key, N: r.N - o.Took, Limit: r.Limit, ID: r.ID, Holder: r.Holder, Gen: r.Gen})
		}
	}
	return failed, err
}

// RefundOutcome is what became of one refund of RefundEach.
type RefundOutcome struct {
	Took int64 // how many of its N the ledger took back
	// Err is the refund's call's error. A call that got no reply (a
	// timeout, a broken connection) may have run all the same: Applied
	// tells, for a refund with an ID.
	Err error
}

// RefundEach is Refund, but returns each refund's outcome, in order; the
// reasons of those that failed are also joined in err. Bad input fails
// all of them before any is sent: outs is then nil.
func (l *Limiter) RefundEach(ctx context.Context, refunds ...Refund) (outs []RefundOutcome, err error) {
	if err := l.checkLease(); err != nil {
		return nil, err
	}
	plans := make([]*plan, len(refunds))
	for i, r := range refunds {
		p, err := l.planFor(r.Limit)
		if err != nil {
			return nil, fmt.Errorf("%w (the refund's limit)", err)
		}
		if err := check.Key(r.Key); err != nil {
			return nil, err
		}
		// N may pass the limit's capacity: a lease claimed under a larger
		// limit, the key's before a downgrade. The ledger gives back at
		// most what the holder's record holds.
		if r.N < 0 || r.N > tierlimit.MaxRate || r.Received < 0 || r.Spent < 0 || r.Spent > p.maxN {
			return nil, fmt.Errorf("%w: refund %+v needs 0 <= N <= %d, 0 <= Received and 0 <= Spent <= %d",
				tierlimit.ErrInvalidCost, r, int64(tierlimit.MaxRate), p.maxN)
		}
		plans[i] = p
		if len(r.ID) > 64 {
			return nil, fmt.Errorf("%w: refund ID of %d bytes, more than 64", tierlimit.ErrInvalidKey, len(r.ID))
		}
		if err := checkHolder(r.Holder, r.Gen); err != nil {
			return nil, err
		}
	}
	cmds := l.pipeline(ctx, "refund", len(refunds), func(i int) ([]string, []any) {
		r := &refunds[i]
		keys := l.Keys(r.Key)
		if r.ID != "" {
			keys = append(keys, l.marker(r))
		}
		args := make([]any, 0, 10+len(plans[i].specs))
		args = append(args, l.now(), l.hold, "refund", len(plans[i].specs), r.N, r.Spent, r.Gen, r.Received, flag(r.Live), r.Holder)
		for _, spec := range plans[i].specs {
			args = append(args, spec)
		}
		return keys, args
	})
	outs = make([]RefundOutcome, len(refunds))
	var errs []error
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			outs[i].Err = err
			errs = append(errs, fmt.Errorf("refund %d to %q: %w", refunds[i].N, refunds[i].Key, err))
			continue
		}
		outs[i].Took = tookBack(c)
	}
	return outs, errors.Join(errs...)
}

// marker returns the key of refund r's marker (r.ID): in r.Key's slot,
// with '!' after the tag, where every state key has ':', so that a marker
// never names the state of any user key.
func (l *Limiter) marker(r *Refund) string {
	tag := keyTag(r.Key)
	return l.bases[0] + string(tag[:]) + "}!" + r.ID
}

// MarkerTTL is how long Redis keeps a refund's marker after running it
// (done in lua/lib.lua): how long it applies a Refund.ID once, and how
// long Applied can tell that it ran.
const MarkerTTL = 30 * time.Second

// Applied reports, for each refund (each with an ID), how many of its N
// the ledger took back if Redis ran it within the last MarkerTTL (its
// marker says so), or -1 if it did not run in that time. A refund whose
// call got no reply may have run: a paused server runs the commands
// queued in it when it resumes, past the client's timeout.
func (l *Limiter) Applied(ctx context.Context, refunds ...Refund) ([]int64, error) {
	cmds := make([]*redis.StringCmd, len(refunds))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range refunds {
			cmds[i] = p.Get(ctx, l.marker(&refunds[i]))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	took := make([]int64, len(refunds))
	for i, c := range cmds {
		n, err := c.Int64()
		switch {
		case errors.Is(err, redis.Nil):
			n = -1
		case err != nil:
			return nil, fmt.Errorf("refund %q's marker: %w", refunds[i].ID, err)
		}
		took[i] = n
	}
	return took, nil
}

// tookBack reads from a ledger refund's reply how many of its leased tokens
// the buckets took back.
func tookBack(c *redis.Cmd) int64 {
	reply, err := c.Slice()
	if err != nil || len(reply) < 2 {
		return 0
	}
	n, _ := reply[1].(int64)
	return n
}

// Grant is the outcome of one claim: LeaseGrant's, or one of LeaseBatch's.
type Grant struct {
	Granted int64
	Result  tierlimit.Result
	// Full says that every limit's bucket stood at its ceiling after the
	// claim: its level plus what its ledger's records hold reached its
	// capacity, so nothing was taken from it since it was last full but
	// what the records still count (an upper bound: a holder lowers its
	// record to what it holds at its next call).
	Full bool
	Err  error // this claim failed; nothing was taken
}

// LeaseBatch runs claims[i] for keys[i], as Lease does, in one pipelined
// round trip (one per Cluster node). Bad input fails every claim before any
// is sent. The claims of one slot (all of them on a single Redis) run in
// one script call, up to batchMax of them: Redis runs
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
	l.leaseBatched(ctx, keys, claims, plans, grants)
	return grants
}

// batchMax bounds the claims of one batched script call.
const batchMax = 256

// leaseBatched runs LeaseBatch's claims, in batches of
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
		args := make([]any, 0, 3+10*len(batches[b]))
		args = append(args, l.now(), l.hold, "batch")
		for _, i := range batches[b] {
			ks = l.appendKeys(ks, keys[i])
			args = l.ledgerCall(args, claims[i], plans[i])
		}
		return ks, args
	})
	for b, cmd := range cmds {
		// The batch's replies are one flat array, each claim's as long
		// as its limits make it (result).
		replies, err := cmd.Slice()
		if err == nil {
			want := 0
			for _, i := range batches[b] {
				want += l.replyLen(plans[i].limits)
			}
			if len(replies) != want {
				err = fmt.Errorf("%s: batch reply of %d values, want %d for %d claims",
					l.alg.name, len(replies), want, len(batches[b]))
			}
		}
		at := 0
		for _, i := range batches[b] {
			if err != nil {
				grants[i].Err = err
				continue
			}
			n := l.replyLen(plans[i].limits)
			grants[i] = l.result(replies[at:at+n], plans[i].limits)
			if grants[i].Err == nil {
				grants[i].Result.Uncharged += claims[i].Want - l.sent(claims[i], plans[i])
			}
			at += n
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
