package detach

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCall: Call returns f's results when f ends first, ctx's error as soon
// as ctx ends first (f going on to its end on its own goroutine), and
// ctx's error without calling f for a ctx already done.
func TestCall(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		f       func() (int, error)
		want    int
		wantErr error
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			func() (int, error) { return 1, nil }, 1, nil},
		{"f first", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		},
			func() (int, error) { return 2, nil }, 2, nil},
		{"ctx first", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Millisecond)
		}, func() (int, error) { <-release; close(finished); return 3, nil }, 0, context.DeadlineExceeded},
		{"ctx done before", func() (context.Context, context.CancelFunc) { return ctx, func() {} },
			func() (int, error) { t.Error("f called for a done ctx"); return 4, nil }, 0, context.Canceled},
	} {
		ctx, cancel := c.ctx()
		got, err := Call(ctx, c.f)
		cancel()
		if got != c.want || !errors.Is(err, c.wantErr) || (err == nil) != (c.wantErr == nil) {
			t.Errorf("%s: Call = %d, %v; want %d, %v", c.name, got, err, c.want, c.wantErr)
		}
	}
	close(release)
	<-finished // f ran to its end after Call returned
}
