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
	mu     sync.Mutex
	lines  map[string]*line
	closed bool
	done   chan struct{} // closed by Close; made on first use
}

// line is the waiters of one key. waiters[0] is the head: the only one
// that tries; the others wait for their turn, in order.
type line struct {
	waiters []*waiter
	next    time.Time // when the head tries again; zero while it tries
}

// waiter is one caller in a line. turn is closed when it becomes the head,
// or when it is told to go with err (it cannot be served before its
// deadline): both happen under Lines.mu, and err is set before the close.
type waiter struct {
	turn     chan struct{}
	deadline time.Time // zero: none
	err      error
}

// N calls try, which decides the caller's request, until it admits or
// fails, waiting in key's line between tries. It returns try's admitting
// Result, or try's error. It returns tierlimit.ErrWaitDeadline at once
// when the caller cannot be served before ctx's deadline: its own try
// retries after it (N then returns the denying Result), or the head of
// the line it waits in does, or try's denial is of a blocked key
// (Result.Limit tierlimit.Blocked: no wait ends, and N returns the denial
// with the error). It returns ctx's error when ctx ends first, and
// tierlimit.ErrClosed after Close.
//
// A caller whose ctx has ended is not tried: a try may charge.
func (ls *Lines) N(ctx context.Context, key string, try func() (tierlimit.Result, error)) (tierlimit.Result, error) {
	if err := ctx.Err(); err != nil {
		return tierlimit.Result{}, err
	}
	ln, w, done, head, err := ls.join(ctx, key)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if !head {
		var err error
		select {
		case <-w.turn:
			err = w.err // set before turn closed
		case <-ctx.Done():
			err = ctx.Err()
		case <-done:
			err = tierlimit.ErrClosed
		}
		if err != nil {
			ls.quit(key, ln, w)
			return tierlimit.Result{}, err
		}
	}
	defer ls.leave(key, ln)
	return ls.head(ctx, key, ln, done, try)
}

// head tries as the head of ln until try admits or fails, or the caller
// must go.
func (ls *Lines) head(ctx context.Context, key string, ln *line, done <-chan struct{}, try func() (tierlimit.Result, error)) (tierlimit.Result, error) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-done:
			return tierlimit.Result{}, tierlimit.ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return tierlimit.Result{}, err
		}
		res, err := try()
		if err != nil || res.Allowed {
			return res, err
		}
		if res.Limit.IsBlocked() {
			return res, fmt.Errorf("%w: key %q is blocked (tierlimit.Blocked): no wait ends", tierlimit.ErrWaitDeadline, key)
		}
		pause := max(res.RetryAfter, minPause)
		next := time.Now().Add(pause)
		if d, ok := ctx.Deadline(); ok && next.After(d) {
			return res, fmt.Errorf("%w: key %q retries after %v", tierlimit.ErrWaitDeadline, key, res.RetryAfter)
		}
		ls.pause(key, ln, next)
		timer.Reset(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return res, ctx.Err()
		case <-done:
			return res, tierlimit.ErrClosed
		}
		ls.mu.Lock()
		ln.next = time.Time{}
		ls.mu.Unlock()
	}
}

// join puts the caller at the end of key's line, and returns the line, the
// caller's place in it, the channel Close closes and whether the caller is
// the head. It fails with ErrWaitDeadline when the head's next try
// comes after ctx's deadline: the caller could only be served later still.
func (ls *Lines) join(ctx context.Context, key string) (ln *line, w *waiter, done <-chan struct{}, head bool, err error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil, nil, nil, false, tierlimit.ErrClosed
	}
	if ls.lines == nil {
		ls.lines = make(map[string]*line)
		ls.done = make(chan struct{})
	}
	d, _ := ctx.Deadline()
	ln = ls.lines[key]
	if ln == nil {
		ln = &line{}
		ls.lines[key] = ln
	} else if !d.IsZero() && ln.next.After(d) {
		return nil, nil, nil, false, fmt.Errorf("%w: key %q has waiters until %v", tierlimit.ErrWaitDeadline,
			key, time.Until(ln.next).Round(time.Microsecond))
	}
	w = &waiter{turn: make(chan struct{}), deadline: d}
	ln.waiters = append(ln.waiters, w)
	return ln, w, ls.done, len(ln.waiters) == 1, nil
}

// pause records when ln's head tries next, and sends away at once the
// waiters that could only be served after their deadline.
func (ls *Lines) pause(key string, ln *line, next time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ln.next = next
	kept := ln.waiters[:1]
	for _, w := range ln.waiters[1:] {
		if w.deadline.IsZero() || !next.After(w.deadline) {
			kept = append(kept, w)
			continue
		}
		w.err = fmt.Errorf("%w: key %q has waiters until %v", tierlimit.ErrWaitDeadline,
			key, time.Until(next).Round(time.Microsecond))
		close(w.turn)
	}
	clear(ln.waiters[len(kept):])
	ln.waiters = kept
}

// leave ends the head's turn.
func (ls *Lines) leave(key string, ln *line) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.pass(key, ln)
}

// pass takes the head out of ln: the next waiter becomes the head, or the
// line goes when it was the last. ls.mu must be held.
func (ls *Lines) pass(key string, ln *line) {
	ln.waiters[0] = nil
	ln.waiters = ln.waiters[1:]
	ln.next = time.Time{}
	if len(ln.waiters) == 0 {
		delete(ls.lines, key)
		return
	}
	close(ln.waiters[0].turn)
}

// quit takes a waiter that goes without trying out of its line. If its
// turn came meanwhile, it passes the turn on; if pause sent it away, it is
// out already.
func (ls *Lines) quit(key string, ln *line, w *waiter) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i, o := range ln.waiters {
		if o != w {
			continue
		}
		if i == 0 {
			ls.pass(key, ln)
			return
		}
		copy(ln.waiters[i:], ln.waiters[i+1:])
		ln.waiters[len(ln.waiters)-1] = nil
		ln.waiters = ln.waiters[:len(ln.waiters)-1]
		return
	}
}

// Close ends every wait: the callers of N, waiting or later, get
// tierlimit.ErrClosed (a try in progress ends first). It is safe to call
// twice.
func (ls *Lines) Close() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return
	}
	ls.closed = true
	if ls.done != nil {
		close(ls.done)
	}
}

// Len returns the number of keys with waiters: no line outlives its last
// waiter.
func (ls *Lines) Len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.lines)
}
