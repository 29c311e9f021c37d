// Package httplimit is net/http middleware that rate limits requests with
// any tierlimit.Limiter (local, remote or hybrid) and tells clients where
// they stand with the IETF RateLimit header fields.
//
// A [Middleware] keys each request by client IP (believing X-Forwarded-For
// or Forwarded only from trusted proxies, and keying IPv6 clients by their
// /64), by a header or by a [KeyFunc] of yours; it may ask several limiters
// at once, per route and per user, each at its own cost (requests, bytes:
// [WithLimiterCost]). A denied request gets 429 Too Many
// Requests, with Retry-After when there is a wait to state (never 0), or
// is served anyway in shadow mode
// ([WithShadow]), which decides and charges as enforcing would, for rolling
// out a limit. A failing limiter lets requests through unless
// [WithFailClosed] says otherwise.
//
//	mw, err := httplimit.New(lim, httplimit.WithTrustedProxies("10.0.0.0/8"))
//	if err != nil { ... } // errors.Is(err, tierlimit.ErrInvalidOption)
//	http.ListenAndServe(addr, mw.Handler(mux))
package httplimit
