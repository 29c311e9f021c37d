package detach

import (
	"context"
	"errors"
	"testing"
	"time"
)

type key struct{}

// TestCall: Call and Run return f's results when f ends first, ctx's error
// as soon as ctx ends first (f going on to its end on its own goroutine,
// under ctx for Call, under ctx without its cancellation for Run), and f's
// results, f given ctx, for a ctx that cannot end or is done already.
func TestCall(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	type call func(context.Context, func(context.Context) (int, error)) (int, error)
	for _, fn := range []struct {
		name     string
		call     call
		detached bool
	}{{"Call", func(ctx context.Context, f func(context.Context) (int, error)) (int, error) {
		return Call(false, ctx, f)
	}, false},
		{"Run", Run[int], true}} {
		release := make(chan struct{})
		finished := make(chan error, 1)
		for _, c := range []struct {
			name    string
			ctx     func() (context.Context, context.CancelFunc)
			f       func(context.Context) (int, error)
			want    int
			wantErr error
		}{
			{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
				func(context.Context) (int, error) { return 1, nil }, 1, nil},
			{"f first", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Minute)
			},
				func(context.Context) (int, error) { return 2, nil }, 2, nil},
			{"ctx first", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.WithValue(context.Background(), key{}, 1), 10*time.Millisecond)
			}, func(ctx context.Context) (int, error) {
				<-release
				if ctx.Value(key{}) != 1 {
					t.Errorf("%s: f's context lost the caller's values", fn.name)
				}
				finished <- ctx.Err()
				return 3, nil
			}, 0, context.DeadlineExceeded},
			{"ctx done before", func() (context.Context, context.CancelFunc) { return done, func() {} },
				func(ctx context.Context) (int, error) { return 4, ctx.Err() }, 4, context.Canceled},
		} {
			ctx, cancel := c.ctx()
			got, err := fn.call(ctx, c.f)
			cancel()
			if got != c.want || !errors.Is(err, c.wantErr) || (err == nil) != (c.wantErr == nil) {
				t.Errorf("%s, %s: = %d, %v; want %d, %v", fn.name, c.name, got, err, c.want, c.wantErr)
			}
		}
		close(release)
		// f ran to its end after the call returned, its context ended
		// with the caller's for Call, not for Run.
		if err := <-finished; (err == nil) != fn.detached {
			t.Errorf("%s: f's context after the caller's ended: %v, want ended %v", fn.name, err, !fn.detached)
		}
	}
}

// BenchmarkCall is the cost of Call's goroutine alone: a call that
// returns at once, under a context with a deadline, through a client that
// does not honour it (goroutine) and one that does (the caller's).
func BenchmarkCall(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	f := func(context.Context) (int, error) { return 1, nil }
	for _, c := range []struct {
		name    string
		honours bool
	}{{"goroutine", false}, {"inline", true}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Call(c.honours, ctx, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
