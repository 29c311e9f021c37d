// Package detach bounds a caller's wait for a call to Redis by its
// context, whatever the client does with the context: go-redis's default
// client (ContextTimeoutEnabled false) ignores a context's deadline once a
// command is sent, and waits for a stalled server up to its ReadTimeout.
package detach

import "context"

// Call returns f's results, or ctx's error as soon as ctx ends before f
// returns. While ctx can end (ctx.Done() is not nil), f runs on a
// goroutine of its own, which goes on after Call returned on ctx's end,
// until f returns (the client's timeouts bound it); what f then does is
// lost to the caller. f chooses its own context: a read may stop at
// ctx's end, a script that charges should run to its end once sent, so
// that Redis's state is what one call makes whether or not its caller
// waited. A ctx done before the call returns its error without calling f.
func Call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if ctx.Done() == nil {
		return f() // nothing ends the caller's wait but f
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // f's goroutine never blocks on a caller gone
	go func() {
		v, err := f()
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
		return zero, ctx.Err()
	}
}
