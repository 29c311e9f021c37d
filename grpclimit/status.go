package grpclimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PushbackTrailer is the trailer of gRFC A6 in which a server tells a
// retrying client how many milliseconds to wait, or, negative, not to
// retry.
const PushbackTrailer = "grpc-retry-pushback-ms"

// noRetry is the pushback that tells a client not to retry (gRFC A6: a
// negative value).
const noRetry = "-1"

// refuse returns the status of a denied call and sets its pushback
// trailer: the denying limiter with the longest RetryAfter names the
// delay, and a denial no wait admits (see never) forbids retries, with no
// RetryInfo: a delay of 0 would have a retrying client hammer the server.
func refuse(ctx context.Context, ss grpc.ServerStream, outs []outcome) error {
	var by *outcome
	for i := range outs {
		o := &outs[i]
		switch {
		case o.never != waits:
			setTrailer(ctx, ss, noRetry)
			return status.Error(codes.ResourceExhausted, o.never.message(o.rule.name))
		case o.res.Allowed:
		case by == nil || o.res.RetryAfter > by.res.RetryAfter:
			by = o
		}
	}
	d := by.res.RetryAfter
	ms := (d + time.Millisecond - 1) / time.Millisecond
	setTrailer(ctx, ss, strconv.FormatInt(int64(ms), 10))
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("grpclimit: rate limited by %q, retry after %v", by.rule.name, d))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// message is the status message of a call the limiter named policy
// refused for w.
func (w never) message(policy string) string {
	switch w {
	case badCost:
		return fmt.Sprintf("grpclimit: rate limited by %q: the call costs more than the limit can ever admit", policy)
	case badLimit:
		return fmt.Sprintf("grpclimit: refused by %q: no valid limit for the call's key", policy)
	case badLookup:
		return fmt.Sprintf("grpclimit: refused by %q: the limit of the call's key could not be looked up", policy)
	case blocked:
		return fmt.Sprintf("grpclimit: refused by %q: the key is blocked", policy)
	}
	return fmt.Sprintf("grpclimit: rate limited by %q, no retry time known", policy)
}

// setTrailer sets the pushback trailer of the call, on ss when it is a
// stream's. A context that is no server call's (Limit called elsewhere)
// has no trailer to set.
func setTrailer(ctx context.Context, ss grpc.ServerStream, pushback string) {
	md := metadata.Pairs(PushbackTrailer, pushback)
	if ss != nil {
		ss.SetTrailer(md)
		return
	}
	_ = grpc.SetTrailer(ctx, md)
}

// unavailable is the status of a call refused because the limiter named
// policy failed (WithFailClosed).
func unavailable(policy string) error {
	return status.Errorf(codes.Unavailable, "grpclimit: limiter %q unavailable", policy)
}
