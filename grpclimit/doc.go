// Package grpclimit rate limits gRPC servers and paces gRPC clients with
// any tierlimit.Limiter (local, remote or hybrid).
//
// An [Interceptor] keys each call by the peer's address (believing
// x-forwarded-for or forwarded metadata only from trusted proxies, as
// package httplimit does), by a metadata value, by the full method or by
// a [KeyFunc] of yours; it may ask several limiters in order, and a call
// one of them refuses is charged to none. A denied call ends with
// codes.ResourceExhausted, a google.rpc.RetryInfo detail holding the
// limiter's RetryAfter and the grpc-retry-pushback-ms trailer of gRFC A6,
// so that a grpc-go client whose retry policy names RESOURCE_EXHAUSTED
// waits that long and tries again by itself; a call no wait admits (a
// blocked key, a limit or cost a limiter can never admit) gets a pushback
// that forbids retries. A failing limiter lets calls through unless
// [WithFailClosed] says otherwise; [WithShadow] decides and charges
// without refusing.
//
//	in, err := grpclimit.New(lim, grpclimit.WithTrustedProxies("10.0.0.0/8"))
//	if err != nil { ... } // errors.Is(err, tierlimit.ErrInvalidOption)
//	srv := grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream()))
//
// [WaitUnary] and [WaitStream] are client interceptors that wait their
// turn before sending, for batch clients; an *Interceptor is also a
// go-grpc-middleware v2 ratelimit.Limiter ([Interceptor.Limit]).
//
// grpclimit is a module of its own, so that the users of tierlimit who do
// not speak gRPC do not download it.
package grpclimit
