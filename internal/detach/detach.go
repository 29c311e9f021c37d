// Package detach bounds a caller's wait for a call to Redis by its
// context, whatever the client does with the context: go-redis's default
// client (ContextTimeoutEnabled false) ignores a context's deadline once a
// command is sent, and waits for a stalled server up to its ReadTimeout.
package detach

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Honours reports whether go-redis client rdb ends a call at its context's
// deadline by itself (Options.ContextTimeoutEnabled).
func Honours(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Call returns f(ctx)'s results, or ctx's error as soon as ctx ends before
// f returns. While ctx can end (ctx.Done() is not nil) and has not, f runs
// on a goroutine of its own, which goes on after Call returned on ctx's
// end, until f returns (the client's timeouts bound it); what f then does
// is lost to the caller. Otherwise f runs on the caller's goroutine: with
// a ctx already done it checks its input and the client refuses to send;
// with a client that honours deadlines (Honours: honours true) and a ctx
// that has one, the client ends the call at it.
//
// f runs under ctx, so that it does after ctx's end only what it would
// have done had its caller waited: go-redis sends a command again after a
// timeout only while the command's context lasts, so a script sent once
// runs at most once more, when a stalled server reads it.
func Call[T any](honours bool, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	if inline(honours, ctx) {
		return f(ctx)
	}
	return call(ctx, ctx, f, nil)
}

// inline reports whether a call through a client that honours deadlines
// (or not) ends by ctx's end without a goroutine of its own.
func inline(honours bool, ctx context.Context) bool {
	if !honours {
		return false
	}
	_, ok := ctx.Deadline()
	return ok
}

// CallOrphan is Call, and gives f's results to orphan, on f's goroutine,
// when the caller did not get them: what f acquired for a caller gone (a
// permit) is given back.
func CallOrphan[T any](honours bool, ctx context.Context, f func(context.Context) (T, error), orphan func(T, error)) (T, error) {
	if inline(honours, ctx) {
		return f(ctx)
	}
	return call(ctx, ctx, f, orphan)
}

// Run is Call for a call of several steps that must all run once the
// first has (a charge on several Cluster slots, given back when a later
// slot refuses): on its own goroutine, f is given ctx without its
// cancellation (its values kept), so that what f began it finishes
// whether or not its caller waited. The client may then send a command
// again after a timeout of its own (go-redis: MaxRetries).
func Run[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	return call(ctx, context.WithoutCancel(ctx), f, nil)
}

func call[T any](ctx, detached context.Context, f func(context.Context) (T, error), orphan func(T, error)) (T, error) {
	if ctx.Done() == nil || ctx.Err() != nil {
		return f(ctx) // nothing ends the caller's wait but f, or f will not send
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // f's goroutine never blocks on a caller gone
	go func() {
		v, err := f(detached)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		// f may have ended too: a result that is there is the caller's.
		select {
		case r := <-done:
			return r.v, r.err
		default:
		}
		if orphan != nil {
			go func() {
				r := <-done
				orphan(r.v, r.err)
			}()
		}
		var zero T
		return zero, ctx.Err()
	}
}
