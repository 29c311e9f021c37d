// Package wait blocks callers until a limiter admits them: WaitN of every
// tier. Waiters on one key form a line in the process, served first come
// first served, and only the line's head asks the limiter, once per
// RetryAfter: a crowd of waiters costs a backend no more calls than one.
package wait

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
)

// minPause is the shortest pause between two tries of one key, so that a
// denial with RetryAfter 0 (an estimate rounded down) cannot spin.
const minPause = time.Millisecond

// Lines holds the lines of waiters, one per key that has waiters. The zero
// value is ready to use. A Lines is safe for concurrent use and must not be
// copied after first use.
type Lines struct {
	mu    sync.Mutex
	lines map[string]*line
}

// line is the waiters of one key, the head first.
type line struct {
	waiters []*waiter
	next    time.Time // when the head tries again; zero while it tries
}

// waiter is one caller in a line: turn is closed when it becomes the head.
type waiter struct{ turn chan struct{} }

// N calls try, which decides the caller's request, until it admits or
// fails, waiting in key's line between tries. It returns try's admitting
// Result, or try's error. It returns tierlimit.ErrWaitDeadline (with the
// denying Result) at once when the next try would come after ctx's
// deadline, and ctx's error when ctx ends first.
func (ls *Lines) N(ctx context.Context, key string, try func() (tierlimit.Result, error)) (tierlimit.Result, error) {
	if err := ctx.Err(); err != nil {
		return tierlimit.Result{}, err
	}
	ln, w, err := ls.join(ctx, key)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if w != nil {
		select {
		case <-w.turn:
		case <-ctx.Done():
			ls.quit(key, ln, w)
			return tierlimit.Result{}, ctx.Err()
		}
	}
	defer ls.leave(key, ln)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		res, err := try()
		if err != nil || res.Allowed {
			return res, err
		}
		pause := max(res.RetryAfter, minPause)
		next := time.Now().Add(pause)
		if d, ok := ctx.Deadline(); ok && next.After(d) {
			return res, fmt.Errorf("%w: key %q retries after %v", tierlimit.ErrWaitDeadline, key, res.RetryAfter)
		}
		ls.mu.Lock()
		ln.next = next
		ls.mu.Unlock()
		timer.Reset(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		ls.mu.Lock()
		ln.next = time.Time{}
		ls.mu.Unlock()
	}
}

// join puts the caller in key's line. It returns the line and, when the
// line had waiters, the caller's place in it (nil: the caller is the
// head). It fails with ErrWaitDeadline when the head's next try comes
// after ctx's deadline: the caller could only be served later still.
func (ls *Lines) join(ctx context.Context, key string) (*line, *waiter, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.lines == nil {
		ls.lines = make(map[string]*line)
	}
	ln := ls.lines[key]
	if ln == nil {
		ln = &line{}
		ls.lines[key] = ln
		ln.waiters = append(ln.waiters, nil) // the head holds the first place
		return ln, nil, nil
	}
	if d, ok := ctx.Deadline(); ok && !ln.next.IsZero() && ln.next.After(d) {
		return nil, nil, fmt.Errorf("%w: key %q has waiters until %v", tierlimit.ErrWaitDeadline,
			key, time.Until(ln.next).Round(time.Microsecond))
	}
	w := &waiter{turn: make(chan struct{})}
	ln.waiters = append(ln.waiters, w)
	return ln, w, nil
}

// leave ends the head's turn: the next waiter becomes the head, or the
// line goes when it was the last.
func (ls *Lines) leave(key string, ln *line) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ln.waiters = ln.waiters[1:]
	ln.next = time.Time{}
	if len(ln.waiters) == 0 {
		delete(ls.lines, key)
		return
	}
	close(ln.waiters[0].turn)
}

// quit takes a waiter whose ctx ended out of its line. If its turn came
// meanwhile, it passes the turn on.
func (ls *Lines) quit(key string, ln *line, w *waiter) {
	ls.mu.Lock()
	head := ln.waiters[0] == w
	if !head {
		for i, o := range ln.waiters {
			if o == w {
				ln.waiters = append(ln.waiters[:i], ln.waiters[i+1:]...)
				break
			}
		}
	}
	ls.mu.Unlock()
	if head {
		ls.leave(key, ln)
	}
}

// Len returns the number of keys with waiters: no line outlives its last
// waiter.
func (ls *Lines) Len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.lines)
}
