package httplimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"github.com/tierlimit/tierlimit/internal/logline"
)

// rule is one limiter the middleware asks.
type rule struct {
	name   string
	prefix string // name as a structured-field String without its closing quote
	lim    tierlimit.Limiter
	key    KeyFunc                   // nil: the client IP
	cost   func(*http.Request) int64 // nil: the middleware's default cost
	unit   string                    // the quota unit cost counts in
	pk     *partitioner              // nil: no partition keys
	names  quotaNames                // of its quotas, as the fields name them
}

// setPrefix sets r.prefix from r.name.
func (r *rule) setPrefix() {
	q := appendSFString(nil, r.name)
	r.prefix = string(q[:len(q)-1])
}

// Middleware limits the requests of an http.Handler with one or more
// tierlimit.Limiters, and tells clients where they stand with the RateLimit
// header fields. Build one with New; wrap handlers with Handler. A
// Middleware is safe for concurrent use; after New, it changes nothing
// but a cache of the names of its quotas.
//
// For each request it resolves the client IP and asks each limiter in
// order, the one given to New first, with the request's context, at its
// cost (WithLimiterCost, else WithCost, else 1). When a limiter denies,
// the request is denied, and the limiters after it are asked with cost 0
// (a peek that charges nothing) so that their state still shows in the
// headers; the limiters before it, which admitted the request, are given
// their charge back (their Settle, which every tier of this module has: a
// refused request costs no limiter anything; a Limiter without Settle
// keeps the charge). A request refused because a limiter failed
// (WithFailClosed) is given back the same way. Put the limiter most likely
// to deny first: it saves the give-backs.
//
// # Client IP
//
// By default the client IP is the peer's (Request.RemoteAddr) and proxy
// headers are ignored: a client can write anything in them. Behind proxies,
// WithTrustedProxies names the ones whose X-Forwarded-For (or Forwarded,
// see WithProxyHeader) is believed. When the peer is one of them, the
// header is walked from right to left, each element having been written
// by the hop after it: trusted proxies are skipped and the first address
// that is not one is the client. What a client writes itself lies left of
// the element its first proxy appends, so it is never read: neither the
// addresses it prepends nor a malformed element (an unterminated quote,
// say) can change its key. Elements are told apart by their commas alone,
// which no address holds, so a comma inside a quoted Forwarded value makes
// the element malformed.
//
// The walk stops, and the request is keyed as its peer, at an element that
// is not an address (malformed, "unknown", an obfuscated Forwarded
// identifier) reached before the client, or when it has read 16 elements
// (empty ones included) or 4 KiB from the right end of the header (all its
// field lines), so that what a request costs is bounded whatever the
// length of its header. Since the walk ends at the first element that
// trusted proxies did not write, it only ever stops within what they
// wrote: no client can make it key a request as the proxy. That takes a
// proxy that writes what is not an address, or 16 elements or more (or 4
// KiB) written by trusted proxies in front of the client. When the whole
// header names trusted proxies, the client is the left-most one. IPv6
// clients are keyed by their /64 (see WithIPv6Prefix).
//
// # Headers
//
// The fields of draft-ietf-httpapi-ratelimit-headers-11 (May 2026), in
// structured-field syntax (RFC 9651):
//
//	RateLimit-Policy: "api:100/1m";q=100;w=60, "bytes:1000000/1s";q=1000000;qu="content-bytes";w=1
//	RateLimit: "api:100/1m";r=42;t=1, "bytes:1000000/1s";r=650000;t=1
//
// RateLimit-Policy lists a quota policy per limiter that decided the
// request, from the Limit of its Result, so that a key with a limit of
// its own (a limiter's LimitFunc: the API key's plan) is told its own
// quota: q units per w seconds (a period that is not a whole number of
// seconds is rounded up to one that is, and q scaled down to it), qu the
// unit when it is not requests (WithLimiterCost), pk the partition key
// (WithPartitionKey), and tierlimit-burst the burst when it exceeds q (a
// parameter of this implementation, prefixed with its name as the draft's
// §3.1 asks: clients that do not know it ignore it). A policy is named
// after its limiter and its limit,
// "name:rate/period" (with " burst N" when the burst is not the rate), so
// that one name never stands for two quotas: a limiter with several
// limits (remote.WithLimits) or with a limit per key has one name per
// limit, the same on every instance.
//
// RateLimit reports, for each quota unit, the most restrictive limiter of
// that unit: the denying one with the longest RetryAfter, or else the one
// with the fewest units left. r is its Remaining, at most the policy's q
// (a bucket whose burst exceeds its rate may hold more; its policy's
// tierlimit-burst says how much). t is the effective
// window of the draft's §4.1.2: the time within which the key can use no
// more than r, that is until it has one unit more, rounded up to whole
// seconds (so that a client that paces itself by r and t is not refused);
// it is exact for token buckets (local, hybrid, remote's token bucket and
// GCRA), the time until the window moves on for windows, and the limit's
// refill interval when another of a key's several limits is the one that
// fills last; see effectiveWindow. It is never the time until the key is full, which
// would tell a drained 100/min client to wait a minute when it may send
// a request every 0.6 s. A denied request also gets Retry-After, the
// longest RetryAfter of the denying limiters rounded up to whole seconds,
// never before the end of their t. WithLegacyHeaders adds the X-RateLimit-*
// headers, for the most restrictive limiter (among admissions, of the
// first limiter's unit). Headers a wrapped handler sets afterwards win;
// nest two Middlewares and the inner one's headers replace the outer's,
// so give one Middleware every limiter that should show. A handler that
// decides itself (AllowAll, WaitN, Settle) writes the fields of its own
// Result with SetHeaders, which replaces the Middleware's.
//
// # Errors
//
// A limiter's error other than an invalid cost (a failing Redis, a
// cancelled context) is passed to WithErrorFunc and then, by default, the
// middleware fails open: that limiter is left out, from the headers too,
// and the request goes on. WithFailClosed refuses such requests instead.
// Without WithErrorFunc, errors are logged to WithLogger's logger, at most
// one line every 10 seconds.
// A request a limiter can never admit denies the request without
// Retry-After, whatever the error policy, and is reported to
// WithErrorFunc (or logged) saying so: a cost above the key's burst
// (tierlimit.ErrInvalidCost: letting it through would make the limit
// bypassable by cost), and a limit the limiter's LimitFunc got wrong
// (tierlimit.ErrInvalidLimit: letting it through would give a suspended
// tenant, written as PerSecond(0), the run of the service), and a key
// whose LimitLookup failed (tierlimit.ErrLimitLookup: the limiter could
// not tell whether the tenant may be served at all). A key its
// LimitFunc blocks (tierlimit.Blocked) is denied, 429 without Retry-After
// (no promise of when it opens), and is no error; so is any denial without
// a RetryAfter: no Retry-After is ever 0.
//
// A KeyFunc that returns an empty key with ok true is a bug, never an
// unlimited request: the request is refused with 500 Internal Server
// Error under every error policy, and the error, wrapping
// tierlimit.ErrInvalidKey, is reported.
//
// In shadow mode (WithShadow) every request is served, the ones above
// too; each that enforcing would refuse is reported as such.
type Middleware struct {
	rules      []*rule
	ip         resolver
	cost       func(*http.Request) int64
	shadow     bool
	legacy     bool
	denied     http.Handler
	concDenied http.Handler
	failed     http.Handler
	onError    func(*http.Request, error)
	logger     *slog.Logger // nil: slog.Default()
	logged     logline.Every
	onDecision DecisionFunc
	conc       tierlimit.Concurrency // nil: no concurrency limit
}

// New returns a Middleware that asks limiter, and the limiters added with
// WithLimiter, about every request. It returns an error wrapping
// tierlimit.ErrInvalidOption for a nil limiter, a nil or bad option, or two
// limiters with one policy name.
func New(limiter tierlimit.Limiter, opts ...Option) (*Middleware, error) {
	if limiter == nil {
		return nil, invalid("nil limiter")
	}
	cfg := config{name: DefaultPolicy, header: HeaderXForwardedFor, v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	m := &Middleware{
		rules:      append([]*rule{{name: cfg.name, lim: limiter, key: cfg.key, unit: UnitRequests}}, cfg.extra...),
		ip:         newResolver(cfg.trusted, cfg.header, cfg.v6bits),
		cost:       cfg.cost,
		shadow:     cfg.shadow,
		legacy:     cfg.legacy,
		denied:     cfg.denied,
		concDenied: cfg.concDenied,
		failed:     cfg.failed,
		onError:    cfg.onError,
		logger:     cfg.logger,
		onDecision: cfg.onDecision,
		conc:       cfg.conc,
	}
	byName := make(map[string]*rule, len(m.rules))
	for _, r := range m.rules {
		if byName[r.name] != nil {
			return nil, invalid("two limiters named %q", r.name)
		}
		byName[r.name] = r
		r.setPrefix()
	}
	if err := applyCosts(byName, cfg.costs); err != nil {
		return nil, err
	}
	if err := applyPartitionKeys(byName, cfg.pks); err != nil {
		return nil, err
	}
	if m.denied == nil {
		m.denied = http.HandlerFunc(tooMany)
	}
	if m.concDenied == nil {
		m.concDenied = http.HandlerFunc(tooManyInFlight)
	}
	return m, nil
}

// Handler returns next limited by m. A nil next means
// http.DefaultServeMux, as for http.Server.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if next == nil {
		next = http.DefaultServeMux
	}
	if m.conc != nil {
		next = &concHandler{m, next}
	}
	return &handler{m, next}
}

// handler is a Middleware in front of next.
type handler struct {
	m    *Middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.m.serve(w, r, h.next) }

// outcome is one limiter's answer to a request.
type outcome struct {
	rule  *rule
	res   tierlimit.Result
	key   string
	cost  int64       // charged, when res.Allowed
	never bool        // no wait admits the request: a cost above the burst, an invalid limit, a blocked key
	pk    [pkLen]byte // the key's partition key, if rule.pk is set
}

// maxInline is the number of limiters whose outcomes live on the stack
// (a per-route and a per-user one); a larger array costs its zeroing on
// every request.
const maxInline = 2

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	var n int64 // the default cost, once haveN
	haveN := false
	ip, ipOK := m.ip.clientIP(r)
	var buf [maxInline]outcome
	outs := buf[:0]
	denied, failed := false, false
	var (
		lastPK   *partitioner // the last partition key computed: of lastKey, in outs[lastPKAt]
		lastKey  string
		lastPKAt int
	)
	keyless := false // a KeyFunc gave an empty key
	for _, ru := range m.rules {
		key, ok := ip, ipOK
		if ru.key != nil {
			if key, ok = ru.key(r, ip); ok && key == "" {
				m.report(r, fmt.Errorf("httplimit: policy %q: request %s: its KeyFunc returned an empty key for a limited request: %w",
					ru.name, m.verdict(http.StatusInternalServerError), tierlimit.ErrInvalidKey), false)
				keyless, denied = true, true
				continue
			}
		}
		if !ok || key == "" {
			continue
		}
		key = chain.ShortKey(key)
		var cost int64
		switch {
		case denied: // peek
		case ru.cost != nil:
			cost = ru.cost(r)
		default:
			if !haveN {
				n, haveN = m.defaultCost(r), true
			}
			cost = n
		}
		peek := denied
		res, err := ru.lim.AllowN(r.Context(), key, cost)
		switch {
		case err == nil:
			outs = append(outs, outcome{rule: ru, res: res, key: key, cost: cost, never: noWait(res)})
			denied = denied || !res.Allowed
			if m.onDecision != nil && !peek {
				m.onDecision(r.Context(), ru.name, res)
			}
		case errors.Is(err, tierlimit.ErrInvalidCost), errors.Is(err, tierlimit.ErrInvalidLimit), errors.Is(err, tierlimit.ErrLimitLookup):
			m.report(r, m.neverErr(ru.name, cost, err), false)
			outs = append(outs, outcome{rule: ru, never: true})
			denied = true
		default:
			m.report(r, fmt.Errorf("httplimit: policy %q: %w", ru.name, err), true)
			failed = true
			continue
		}
		if o := &outs[len(outs)-1]; ru.pk != nil {
			// Limiters of one key and one secret share a partition key:
			// one HMAC, not one per limiter (BenchmarkOverhead's
			// peer=ipv4-bytes-pk).
			if ru.pk == lastPK && key == lastKey {
				o.pk = outs[lastPKAt].pk
			} else {
				ru.pk.partitionKey(&o.pk, key)
				lastPK, lastKey, lastPKAt = ru.pk, key, len(outs)-1
			}
		}
	}
	refused := (denied || failed && m.failed != nil) && !m.shadow
	if refused {
		m.giveBack(r, outs)
	}
	if keyless && !m.shadow {
		noKey(w, r)
		return
	}
	if failed && m.failed != nil && !m.shadow {
		m.failed.ServeHTTP(w, r)
		return
	}
	if len(outs) > 0 {
		setHeaders(w.Header(), outs, denied && !m.shadow, m.legacy)
	}
	if denied && !m.shadow {
		m.denied.ServeHTTP(w, r)
		return
	}
	next.ServeHTTP(w, r)
}

// giveBack settles the charges of a refused request: each limiter that
// admitted it gets its cost back, if it can (chain.Settler), and its outcome
// shows what it holds then.
func (m *Middleware) giveBack(r *http.Request, outs []outcome) {
	for i := range outs {
		o := &outs[i]
		if !o.res.Allowed {
			continue
		}
		res, ok, err := chain.GiveBack(r.Context(), o.rule.lim, o.key, o.cost)
		if err != nil {
			m.report(r, fmt.Errorf("httplimit: policy %q: giving back a refused request's charge of %d: %w", o.rule.name, o.cost, err), false)
			continue
		}
		if ok {
			o.res.Remaining = res.Remaining
		}
	}
}

// defaultCost returns the cost of r for the limiters without their own:
// WithCost's, else 1. A negative cost is passed on as such, for the
// limiter to refuse.
func (m *Middleware) defaultCost(r *http.Request) int64 {
	if m.cost == nil {
		return 1
	}
	return m.cost(r)
}

// noWait reports whether res is a denial no wait admits: a blocked key
// (tierlimit.Blocked), or a denial without a RetryAfter, which promises
// nothing about when the request can pass.
func noWait(res tierlimit.Result) bool {
	return !res.Allowed && (res.Limit.IsBlocked() || res.RetryAfter <= 0)
}

// neverErr is the error reported for a request refused because limiter
// name can never admit it at cost: err wraps tierlimit.ErrInvalidCost,
// tierlimit.ErrInvalidLimit or tierlimit.ErrLimitLookup.
func (m *Middleware) neverErr(name string, cost int64, err error) error {
	why := "the limiter has no valid limit for its key"
	switch {
	case errors.Is(err, tierlimit.ErrInvalidCost):
		why = fmt.Sprintf("its cost %d is more than the key's burst (or negative): no wait would admit it", cost)
	case errors.Is(err, tierlimit.ErrLimitLookup):
		why = "the lookup of its key's limit failed"
	}
	return fmt.Errorf("httplimit: policy %q: request %s, %s: %w", name, m.verdict(http.StatusTooManyRequests), why, err)
}

// verdict says what the middleware does with a request it refuses with
// code: in shadow mode, serve it.
func (m *Middleware) verdict(code int) string {
	if m.shadow {
		return fmt.Sprintf("served in shadow mode (enforcing would refuse it with %d, no Retry-After)", code)
	}
	return fmt.Sprintf("refused with %d (no Retry-After)", code)
}

// report passes err to WithErrorFunc's function, or logs it. failure says
// that err is a limiter's failure, which the error policy (fail open or
// closed) decided the request's fate by; the other errors say themselves
// what was done.
func (m *Middleware) report(r *http.Request, err error, failure bool) {
	if m.onError != nil {
		m.onError(r, err)
		return
	}
	// Without WithErrorFunc, errors are logged, at most one line per
	// logEvery: a limiter that keeps failing (tierlimit.ErrMisconfigured
	// after a password change, say) must not leave the service unlimited
	// in silence.
	if m.logged.Allow(time.Now(), logEvery) {
		msg, attrs := "httplimit: a request was refused (logged at most every 10s; WithErrorFunc to handle)", []slog.Attr{slog.Any("err", err)}
		if m.shadow {
			msg = "httplimit: a request enforcing would refuse was served in shadow mode (logged at most every 10s; WithErrorFunc to handle)"
		}
		if failure {
			msg = "httplimit: limiter error (logged at most every 10s; WithErrorFunc to handle)"
			attrs = append(attrs, slog.String("failing", m.policyName()))
		}
		logline.Or(m.logger).LogAttrs(r.Context(), slog.LevelWarn, msg, attrs...)
	}
}

// logEvery spaces the default error log lines.
const logEvery = 10 * time.Second

// policyName says what happens to a request whose limiter failed.
func (m *Middleware) policyName() string {
	if m.failed != nil {
		return "closed"
	}
	return "open"
}

// tooMany is the default denied handler.
func tooMany(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

// noKey answers a request a KeyFunc gave an empty key.
func noKey(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// unavailable is the default handler of WithFailClosed.
func unavailable(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
}
