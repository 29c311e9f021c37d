package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/chain"
	"github.com/tierlimit/tierlimit/internal/clientip"
	"github.com/tierlimit/tierlimit/internal/logline"
)

// rule is one limiter the interceptor asks.
type rule struct {
	name string
	lim  tierlimit.Limiter
	key  KeyFunc // nil: the peer
}

// Interceptor limits the calls of a gRPC server with one or more
// tierlimit.Limiters. Build one with New; install Unary and Stream. An
// Interceptor is safe for concurrent use and is not changed after New.
//
// For each call it asks each limiter in order, the one given to New
// first, with the call's context and key, at the call's cost (WithCost,
// else 1). When a limiter denies, the call is denied, the limiters after
// it are asked with cost 0 (a peek that charges nothing), and the ones
// before it, which admitted the call, are given their charge back (their
// Settle, which every tier of this module has): a refused call costs no
// limiter anything. A call refused because a limiter failed
// (WithFailClosed) is given back the same way. A stream is charged once,
// when it opens; WithMessageLimiter charges its messages.
//
// # Denials
//
// A denied call ends with codes.ResourceExhausted, whose message names
// the denying limiter (never the key, which may be personal data), whose
// details hold a google.rpc.RetryInfo with the longest RetryAfter of the
// denying limiters, and whose trailer holds grpc-retry-pushback-ms, that
// delay in milliseconds rounded up (gRFC A6): a grpc-go client with a
// retry policy for RESOURCE_EXHAUSTED waits exactly that long before it
// tries again. A call no wait admits is denied without RetryInfo and with
// a pushback of -1, which tells such clients not to retry: a cost a
// limiter can never admit (tierlimit.ErrInvalidCost), a key its
// LimitFunc blocks (tierlimit.Blocked, which promises nothing about when
// it opens), a denial without a RetryAfter, and a limit the limiter's
// LimitFunc got wrong (tierlimit.ErrInvalidLimit: serving the call would
// give a suspended tenant, written as PerSecond(0), the run of the
// service), and a key whose LimitLookup failed (tierlimit.ErrLimitLookup:
// the limiter could not tell whether the tenant may call at all). These
// are denials under every error policy.
//
// # Errors
//
// A limiter's error other than those (a failing Redis, a cancelled
// context) is passed to WithErrorFunc and then, by default, the
// interceptor fails open: that limiter is left out and the call goes on.
// WithFailClosed refuses such calls with codes.Unavailable instead.
// A KeyFunc that returns an empty key with ok true is a bug, never an
// unlimited call: the call is refused with codes.Internal (pushback -1)
// under every error policy, and the error, wrapping
// tierlimit.ErrInvalidKey, is reported. Errors, and the invalid costs
// and limits above, are reported to WithErrorFunc, or without it logged
// to WithLogger's logger, at most one line every 10 seconds.
//
// In shadow mode (WithShadow) every call is served, the ones above too;
// each that enforcing would refuse is reported as such.
type Interceptor struct {
	rules      []*rule
	messages   []*rule
	ip         clientip.Resolver
	header     string // the metadata key trusted proxies write
	cost       func(ctx context.Context, fullMethod string) int64
	shadow     bool
	failClosed bool
	onError    func(ctx context.Context, fullMethod string, err error)
	onDecision DecisionFunc
	logger     *slog.Logger // nil: slog.Default()
	logged     logline.Every
	conc       tierlimit.Concurrency // nil: no concurrency limit
}

// New returns an Interceptor that asks limiter, and the limiters added
// with WithLimiter, about every call. It returns an error wrapping
// tierlimit.ErrInvalidOption for a nil limiter, a nil or bad option, or
// two limiters with one name.
func New(limiter tierlimit.Limiter, opts ...Option) (*Interceptor, error) {
	if limiter == nil {
		return nil, invalid("nil limiter")
	}
	cfg := config{name: DefaultPolicy, v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	in := &Interceptor{
		rules:      append([]*rule{{name: cfg.name, lim: limiter, key: cfg.key}}, cfg.extra...),
		messages:   cfg.messages,
		ip:         clientip.Resolver{Trusted: cfg.trusted, Forwarded: cfg.forwarded, V6Bits: cfg.v6bits},
		header:     MetadataXForwardedFor,
		cost:       cfg.cost,
		shadow:     cfg.shadow,
		failClosed: cfg.failClosed,
		onError:    cfg.onError,
		onDecision: cfg.onDecision,
		logger:     cfg.logger,
		conc:       cfg.conc,
	}
	if cfg.forwarded {
		in.header = MetadataForwarded
	}
	seen := map[string]bool{}
	for _, r := range append(in.rules[:len(in.rules):len(in.rules)], in.messages...) {
		if seen[r.name] {
			return nil, invalid("two limiters named %q", r.name)
		}
		seen[r.name] = true
	}
	return in, nil
}

// Unary returns the unary server interceptor of in.
func (in *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := in.decide(ctx, info.FullMethod, in.rules, false, nil); err != nil {
			return nil, err
		}
		if in.conc != nil {
			p, err := in.permit(ctx, info.FullMethod, nil)
			if err != nil {
				return nil, err
			}
			defer p.Release()
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor of in: a stream is charged
// once, when it opens, and each message it receives is charged to the
// limiters of WithMessageLimiter.
func (in *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := in.decide(ss.Context(), info.FullMethod, in.rules, false, ss); err != nil {
			return err
		}
		if in.conc != nil {
			p, err := in.permit(ss.Context(), info.FullMethod, ss)
			if err != nil {
				return err
			}
			defer p.Release()
		}
		if len(in.messages) > 0 {
			ss = &messageStream{ServerStream: ss, in: in, method: info.FullMethod}
		}
		return handler(srv, ss)
	}
}

// Limit decides the call of ctx, whose method grpc.Method(ctx) tells, as
// Unary does, and returns the denial's status error (or
// codes.Unavailable's, failing closed), nil when the call may go on. With
// it an *Interceptor is a go-grpc-middleware v2 ratelimit.Limiter; that
// middleware rewrites the status, keeping its message but not its
// RetryInfo, so prefer Unary and Stream where they can be installed.
func (in *Interceptor) Limit(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	return in.decide(ctx, method, in.rules, false, nil)
}

// messageStream charges each message its client sends.
type messageStream struct {
	grpc.ServerStream
	in     *Interceptor
	method string
}

// RecvMsg receives a message and charges it, returning the denial's status
// when a message limiter refuses it.
func (s *messageStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.in.decide(s.Context(), s.method, s.in.messages, true, s.ServerStream)
}

// outcome is one limiter's answer to a call.
type outcome struct {
	rule  *rule
	res   tierlimit.Result
	key   string
	cost  int64 // charged, when res.Allowed
	never never // why no wait admits the call, if none does
}

// never says why no wait admits a call: a denial that carries no time
// after which a retry can succeed.
type never uint8

const (
	waits        never = iota // an admission, or a denial with a RetryAfter to wait
	badCost                   // tierlimit.ErrInvalidCost: more than the key's burst, or negative
	badLimit                  // tierlimit.ErrInvalidLimit: the limiter has no valid limit for the key
	badLookup                 // tierlimit.ErrLimitLookup: the key's limit could not be looked up
	blocked                   // the key is tierlimit.Blocked
	noRetryAfter              // a denial without a RetryAfter: nothing promises when it passes
)

// neverOf says whether a Result is a denial no wait admits.
func neverOf(res tierlimit.Result) never {
	switch {
	case res.Allowed:
		return waits
	case res.Limit.IsBlocked():
		return blocked
	case res.RetryAfter <= 0:
		return noRetryAfter
	}
	return waits
}

// maxInline is the number of limiters whose outcomes live on the stack.
const maxInline = 2

// decide asks rules about a call (or, message, one message of a stream)
// and returns the status that refuses it, nil to let it go on. ss, when
// not nil, is the stream whose trailer a denial sets.
func (in *Interceptor) decide(ctx context.Context, method string, rules []*rule, message bool, ss grpc.ServerStream) error {
	var (
		buf            [maxInline]outcome
		outs           = buf[:0]
		ip             string
		haveIP         bool
		n              int64
		haveN          bool
		denied, failed bool
		keyless        bool // a KeyFunc gave an empty key
		failedName     string
	)
	for _, ru := range rules {
		var key string
		var ok bool
		if ru.key != nil {
			key, ok = ru.key(ctx, method)
			if ok && key == "" {
				in.report(ctx, method, fmt.Errorf("grpclimit: policy %q: call %s: its KeyFunc returned an empty key for a limited call: %w",
					ru.name, in.verdict(codes.Internal), tierlimit.ErrInvalidKey), false)
				keyless, denied = true, true
				continue
			}
		} else {
			if !haveIP {
				ip, haveIP = in.clientIP(ctx), true
			}
			key, ok = ip, ip != ""
		}
		if !ok {
			continue
		}
		key = chain.ShortKey(key)
		var cost int64
		switch {
		case denied: // peek
		case message:
			cost = 1
		default:
			if !haveN {
				n, haveN = in.callCost(ctx, method), true
			}
			cost = n
		}
		peek := denied
		res, err := ru.lim.AllowN(ctx, key, cost)
		switch {
		case err == nil:
			outs = append(outs, outcome{rule: ru, res: res, key: key, cost: cost, never: neverOf(res)})
			denied = denied || !res.Allowed
			if in.onDecision != nil && !peek {
				in.onDecision(ctx, ru.name, res)
			}
		case errors.Is(err, tierlimit.ErrInvalidCost), errors.Is(err, tierlimit.ErrInvalidLimit), errors.Is(err, tierlimit.ErrLimitLookup):
			why := badLimit
			switch {
			case errors.Is(err, tierlimit.ErrInvalidCost):
				why = badCost
			case errors.Is(err, tierlimit.ErrLimitLookup):
				why = badLookup
			}
			in.report(ctx, method, fmt.Errorf("grpclimit: policy %q: call %s, %s: %w",
				ru.name, in.verdict(codes.ResourceExhausted), why.reason(cost), err), false)
			outs = append(outs, outcome{rule: ru, never: why})
			denied = true
		default:
			in.report(ctx, method, fmt.Errorf("grpclimit: policy %q: %w", ru.name, err), true)
			if !failed {
				failedName = ru.name
			}
			failed = true
		}
	}
	if in.shadow || !denied && !(failed && in.failClosed) {
		return nil
	}
	in.giveBack(ctx, method, outs)
	switch {
	case keyless:
		setTrailer(ctx, ss, noRetry)
		return status.Error(codes.Internal, "grpclimit: the call has no key to be limited by")
	case denied:
		return refuse(ctx, ss, outs)
	}
	return unavailable(failedName)
}

// reason says, in an error reported for a call, why no wait admits it.
func (w never) reason(cost int64) string {
	switch w {
	case badCost:
		return fmt.Sprintf("its cost %d is more than the key's burst (or negative): no wait would admit it", cost)
	case badLimit:
		return "the limiter has no valid limit for its key"
	case badLookup:
		return "the lookup of its key's limit failed"
	}
	return "no wait would admit it"
}

// verdict says what the interceptor does with a call it refuses with
// code: in shadow mode, serve it.
func (in *Interceptor) verdict(code codes.Code) string {
	if in.shadow {
		return fmt.Sprintf("served in shadow mode (enforcing would refuse it with %v, no retry)", code)
	}
	return fmt.Sprintf("refused with %v, no retry", code)
}

// giveBack settles the charges of a refused call: each limiter that
// admitted it gets its cost back, if it can.
func (in *Interceptor) giveBack(ctx context.Context, method string, outs []outcome) {
	for i := range outs {
		o := &outs[i]
		if !o.res.Allowed {
			continue
		}
		if _, _, err := chain.GiveBack(ctx, o.rule.lim, o.key, o.cost); err != nil {
			in.report(ctx, method, fmt.Errorf("grpclimit: policy %q: give back: %w", o.rule.name, err), false)
		}
	}
}

// clientIP returns the key of the call's client: its peer's address, or
// the client trusted proxies name in the metadata, as the peer's text
// when it is not an IP address; "" when the call has no peer.
func (in *Interceptor) clientIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	var lines []string
	if len(in.ip.Trusted) > 0 {
		lines = metadata.ValueFromIncomingContext(ctx, in.header)
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		// The address as it is, not its text parsed back: a peer costs
		// no allocation but its key (BenchmarkOverhead).
		return in.ip.ClientAddr(tcp.AddrPort().Addr(), lines)
	}
	key, _ := in.ip.ClientIP(p.Addr.String(), lines)
	return key
}

// callCost returns the cost of a call: WithCost's, else 1.
func (in *Interceptor) callCost(ctx context.Context, method string) int64 {
	if in.cost == nil {
		return 1
	}
	return in.cost(ctx, method)
}

// logEvery spaces the default error log lines.
const logEvery = 10 * time.Second

// report passes err to WithErrorFunc's function, or logs it. failure says
// that err is a limiter's failure, whose call the error policy (fail open
// or closed) decided; the other errors say themselves what was done.
func (in *Interceptor) report(ctx context.Context, method string, err error, failure bool) {
	if in.onError != nil {
		in.onError(ctx, method, err)
		return
	}
	// Without WithErrorFunc, errors are logged, at most one line per
	// logEvery: a limiter that keeps failing must not leave the service
	// unlimited (or refusing) in silence.
	if in.logged.Allow(time.Now(), logEvery) {
		msg, attrs := "grpclimit: a call was refused (logged at most every 10s; WithErrorFunc to handle)",
			[]slog.Attr{slog.String("method", method), slog.Any("err", err)}
		if in.shadow {
			msg = "grpclimit: a call enforcing would refuse was served in shadow mode (logged at most every 10s; WithErrorFunc to handle)"
		}
		if failure {
			policy := "open"
			if in.failClosed {
				policy = "closed"
			}
			msg = "grpclimit: limiter error (logged at most every 10s; WithErrorFunc to handle)"
			attrs = append(attrs, slog.String("failing", policy))
		}
		logline.Or(in.logger).LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
	}
}
