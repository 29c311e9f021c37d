package hybrid

// The entries: a key's in-process state, and the table that holds them
// (ristretto, its front table and the entries it dropped).

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/tierlimit/tierlimit/internal/front"
	"github.com/tierlimit/tierlimit/internal/gate"
)

// entry is the in-process state of one key. Its fields are atomics: the hot
// path reads and spends without a lock. They are grouped by how they are
// shared between cores: a local decision writes only the last group (one
// cache line, already owned after the spend's CAS) and reads the first,
// which claims write (BenchmarkHotKeyParallel, BenchmarkZipf10k).
type entry struct {
	// Read by every decision, written by claims.
	key          string
	stripe       uint8                  // of the decision counters
	evicted      atomic.Bool            // ristretto dropped e: refund its tokens, refill it no more
	stale        atomic.Bool            // Reset forgot the key: e takes no more tokens
	blockedUntil atomic.Int64           // ns: Redis cannot grant n tokens before then
	remote       atomic.Int64           // Redis's Remaining at the last claim
	lastSize     atomic.Int64           // tokens granted by the last claim
	pol          atomic.Pointer[policy] // the key's limit (WithLimitFunc), as the LimitFunc last answered

	// Claims, refills and the janitor only.
	holder     string                        // e's name in the bucket's lease ledger: unique in the fleet
	gen        atomic.Int64                  // e's claims so far, with the ledger; written under the key lock, read by Close without it
	received   atomic.Int64                  // what e's claims' replies granted, in total (store.Claim.Received); written under the key lock
	covered    atomic.Int64                  // tokens e's ledger record holds at least, as far as e knows: what its lease may hold (giveToLease); written under the key lock
	lost       atomic.Bool                   // a claim's call failed without a reply since e's last refund: the ledger may hold tokens for e that e never got
	expires    atomic.Int64                  // ns: unspent tokens are refunded then
	lastClaim  atomic.Int64                  // ns of the last claim
	stallClaim atomic.Int64                  // the stall clock at the last claim (see size)
	refillDone atomic.Pointer[chan struct{}] // a refill is queued or running; closed when it is done
	fb         atomic.Pointer[fallback]      // the key's bucket in the last outage (mode FailFallback)
	owed       atomic.Int64                  // tokens fallbacks admitted that Redis was not yet charged
	owedSince  atomic.Int64                  // ns: the first charge that left some owed (see paid), or 0
	asked      atomic.Int64                  // ns: when the LimitFunc last answered for e's key (see policyFor)

	_ [64]byte // keeps the group below off the lines above

	// Written by every local decision, and read: the spend's CAS owns
	// this line, so counting here costs no other core's line.
	tokens  atomic.Int64 // leased tokens not yet spent
	expired atomic.Bool  // the lease passed its TTL and the janitor could not take it back yet (see collect): spend none
	demand  atomic.Int64 // tokens asked for since the last claim (see size)
	local   atomic.Int64 // allowed local decisions not yet added to the limiter's count (see countLocal)
	retired atomic.Bool  // the table no longer holds e: a spend adds its count at once
}

// table is a Limiter's one registry of keys: where a decision finds a key's
// entry, where the janitor, Stats and Close find every entry that holds
// tokens, and what makes Close safe with calls in flight. It is safe for
// concurrent use.
//
// ristretto owns the entries: it bounds their number and keeps the most
// used (its admission policy). Three things wrap it:
//   - hot, the front table of recently found entries (internal/front): a
//     hit is a hash and an atomic load instead of ristretto's Get
//     (BenchmarkAllowLease); every claim reads ristretto (touch), so that
//     its frequency sketch sees the hot keys once per lease, off the path
//     of the spends;
//   - dropped, the entries ristretto evicted or refused that may still hold
//     tokens (a claim in flight may land some after the drop) or owe some
//     to Redis: the janitor refunds or charges them, and forgets each once
//     it holds and owes none. A key whose entry is dropped keeps using it
//     (droppedFor) rather than making one per call, so that its lease,
//     its fallback bucket and its debt stay in one place, and dropped
//     holds at most about one entry per key;
//   - gate, which Close shuts before it closes ristretto: ristretto's Get,
//     Set and Del may panic or block once its Close has begun.
//
// Lock order: a Limiter's key locks (several in index order) before mu;
// ristretto's own locks are taken inside its calls, and its callbacks
// (drop) take mu, so no ristretto call is made under mu.
type table struct {
	cache *ristretto.Cache[string, *entry]
	hot   *front.Table[entry]
	gate  gate.Gate

	mu       sync.Mutex
	dropped  map[string][]*entry // per key, its dropped entries the table follows, the last dropped last
	ndropped int64               // the entries in dropped

	retire func(*entry) // counts a dropped entry's decisions for the last time (limiter.retire)
}

func newTable(maxKeys int64, retire func(*entry)) (*table, error) {
	t := &table{hot: front.New[entry](maxKeys), dropped: make(map[string][]*entry), retire: retire}
	var err error
	t.cache, err = ristretto.NewCache(&ristretto.Config[string, *entry]{
		NumCounters:        maxKeys * 10,
		MaxCost:            maxKeys,
		BufferItems:        64,
		IgnoreInternalCost: true,
		OnExit:             t.drop, // evicted, rejected, replaced or deleted
	})
	return t, err
}

// spendable returns what e's lease may spend: its tokens, none once it
// has expired.
func (e *entry) spendable() int64 {
	if e.expired.Load() {
		return 0
	}
	return e.tokens.Load()
}

// enter lets a call that uses ristretto in (h: the key's hash), or reports
// false once Close has begun; exit ends it.
func (t *table) enter(h uint64) bool { return t.gate.Enter(h) }
func (t *table) exit(h uint64)       { t.gate.Exit(h) }

// find returns key's entry (h is keyHash(key)), if it has one that is
// neither evicted nor stale.
func (t *table) find(key string, h uint64) (*entry, bool) {
	set, tag := t.hot.Set(h)
	for i := range front.Ways {
		if e := set.Load(i, tag); e != nil && e.key == key && !e.evicted.Load() && !e.stale.Load() {
			return e, true
		}
	}
	if !t.enter(h) {
		return nil, false
	}
	defer t.exit(h)
	e, ok := t.cache.Get(key)
	if ok {
		set.Store(tag, e)
	}
	return e, ok
}

// add registers e for its key, and waits until find sees it. If ristretto
// refuses it, or drops the Set (its buffer full), e is dropped at once (and
// still serves its caller's claim). The caller is inside the gate.
func (t *table) add(e *entry) {
	if !t.cache.Set(e.key, e, 1) {
		t.drop(e)
		return
	}
	t.cache.Wait()
}

// touch reads key in ristretto, so that its admission policy counts a use
// of a key the front table answers (apply calls it once per claim).
func (t *table) touch(key string) {
	h := keyHash(key)
	if t.enter(h) {
		t.cache.Get(key)
		t.exit(h)
	}
}

// del forgets key's entry in ristretto. The caller is inside the gate.
func (t *table) del(key string) {
	t.cache.Del(key)
	t.cache.Wait()
}

// drop is ristretto's callback for an entry leaving it (evicted, rejected,
// replaced by another Set of its key, deleted): e refunds its tokens at the
// janitor's next round and is refilled no more, and the table follows it
// until it holds and owes nothing (forget). One that holds and owes nothing
// already is forgotten at once: entries that ristretto drops faster than
// the janitor's rounds (new keys decided while the breaker is open, which
// claim nothing) would otherwise stay followed until the next round, a
// heap that grows with the keys' arrival rate (G6). A claim that lands
// tokens in e later keeps it again (land).
func (t *table) drop(e *entry) {
	if e == nil {
		return
	}
	e.evicted.Store(true)
	e.expires.Store(0)
	t.keep(e)
	if t.forget(e) {
		t.retire(e)
	}
}

// keep records that e, which ristretto dropped, may hold tokens: a claim
// that lands tokens in an evicted entry calls it after adding them.
func (t *table) keep(e *entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	es := t.dropped[e.key]
	if i := slices.Index(es, e); i >= 0 {
		// Followed already: it is the key's last dropped entry again.
		es = append(slices.Delete(es, i, i+1), e)
	} else {
		es = append(es, e)
		t.ndropped++
	}
	t.dropped[e.key] = es
}

// droppedFor returns key's entry that ristretto dropped, if the table still
// follows one and Reset has not made it stale.
func (t *table) droppedFor(key string) (*entry, bool) {
	t.mu.Lock()
	es := t.dropped[key]
	var e *entry
	if len(es) > 0 {
		e = es[len(es)-1]
	}
	t.mu.Unlock()
	return e, e != nil && !e.stale.Load()
}

// holding returns every entry that holds tokens, owes some to Redis, or
// may have been granted some it never heard of (a reply lost):
// ristretto's and the dropped ones. Once shut, it returns the dropped ones
// only.
func (t *table) holding() []*entry {
	var out []*entry
	if t.enter(0) {
		out = t.cached()
		t.exit(0)
	}
	return append(out, t.droppedNow()...)
}

// cached returns ristretto's entries that hold tokens or owe some.
func (t *table) cached() []*entry {
	var out []*entry
	t.cache.IterValues(func(e *entry) bool {
		if e.tokens.Load() > 0 || e.owed.Load() > 0 || e.lost.Load() {
			out = append(out, e)
		}
		return false
	})
	return out
}

// droppedLen returns the number of dropped entries the table follows.
func (t *table) droppedLen() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ndropped
}

// droppedNow returns the dropped entries the table follows.
func (t *table) droppedNow() []*entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*entry, 0, t.ndropped)
	for _, es := range t.dropped {
		out = append(out, es...)
	}
	return out
}

// forget stops following e if it is a dropped entry that holds no tokens
// and owes none now, and reports whether it did. A claim that lands tokens in e later, or a fallback
// decision that makes it owe some, keeps it again: it adds them before it
// calls keep, and forget checks them under mu.
func (t *table) forget(e *entry) (gone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.tokens.Load() != 0 || e.owed.Load() != 0 || e.lost.Load() {
		return false
	}
	es := t.dropped[e.key]
	i := slices.Index(es, e)
	if i < 0 {
		return false
	}
	t.ndropped--
	if len(es) == 1 {
		delete(t.dropped, e.key)
	} else {
		t.dropped[e.key] = slices.Delete(es, i, i+1)
	}
	return true
}

// each calls f for every entry the table holds: ristretto's and the
// dropped ones (these only, once shut).
func (t *table) each(f func(*entry)) {
	if t.enter(0) {
		t.cache.IterValues(func(e *entry) bool { f(e); return false })
		t.exit(0)
	}
	for _, e := range t.droppedNow() {
		f(e)
	}
}

// shut turns away the calls that would use ristretto and waits for those
// inside, at most wait; it reports whether none is inside. Then, and
// before release, Close uses the table with the calls that were still
// inside, if any: last returns every entry that holds tokens.
func (t *table) shut(wait time.Duration) (drained bool) {
	t.gate.Shut()
	return t.gate.Drain(wait)
}

// last is holding for Close, between shut and release.
func (t *table) last() []*entry { return append(t.cached(), t.droppedNow()...) }

// eachLast is each for Close, between shut and release.
func (t *table) eachLast(f func(*entry)) {
	t.cache.IterValues(func(e *entry) bool { f(e); return false })
	for _, e := range t.droppedNow() {
		f(e)
	}
}

// release closes ristretto, after shut, once no call is inside (it waits).
func (t *table) release() {
	t.gate.Drain(-1)
	t.cache.Close()
}

// entry returns key's entry, following policy p from now on: the cached
// one, else the one ristretto dropped that the table still follows, else a
// new one, cached if ristretto admits it. An entry whose key's limit
// changed (WithLimitFunc) keeps its lease: Redis carries the key's state
// over to the new limit.
func (l *limiter) entry(key string, p *policy) *entry {
	e, ok := l.lookup(key)
	if !ok {
		e, ok = l.keys.droppedFor(key)
	}
	if ok {
		if e.policy() != p {
			e.pol.Store(p)
		}
		return e
	}
	e = &entry{key: key, stripe: uint8(keyHash(key))}
	e.pol.Store(p)
	e.asked.Store(l.now()) // the caller had p from policyFor
	e.holder = l.id + "." + strconv.FormatInt(l.entries.Add(1), 36)
	// If ristretto refuses or drops e, e still serves this claim and the
	// janitor refunds what it holds.
	l.keys.add(e)
	return e
}

// lookup returns key's entry (see table.find).
func (l *limiter) lookup(key string) (*entry, bool) { return l.keys.find(key, keyHash(key)) }

// retire harvests e for the last time: the table no longer holds it.
func (l *limiter) retire(e *entry) {
	e.retired.Store(true)
	l.harvest(e)
}

// forget stops following e if the table may (see table.forget), and
// retires it then.
func (l *limiter) forget(e *entry) {
	if l.keys.forget(e) {
		l.retire(e)
	}
}
