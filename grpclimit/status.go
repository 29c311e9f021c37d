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

// refuse returns the status of a denied call and sets its pushback
// trailer: the denying limiter with the longest RetryAfter names the
// delay, and one whose cost can never be admitted forbids retries.
func refuse(ctx context.Context, ss grpc.ServerStream, outs []outcome) error {
	var by *outcome
	for i := range outs {
		o := &outs[i]
		switch {
		case o.never:
			setTrailer(ctx, ss, "-1")
			return status.Errorf(codes.ResourceExhausted,
				"grpclimit: rate limited by %q: the call costs more than the limit can ever admit", o.rule.name)
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
