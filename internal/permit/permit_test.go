package permit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

func TestLimit(t *testing.T) {
	fn := func(k string) int64 {
		m := map[string]int64{"neg": -2, "five": 5, "huge": tierlimit.MaxPermits + 1, "none": tierlimit.NoPermits}
		if n, ok := m[k]; ok {
			return n
		}
		return tierlimit.DefaultPermits
	}
	for _, tt := range []struct {
		key  string
		fn   tierlimit.PermitFunc
		want int64
		err  error
	}{
		{"k", nil, 3, nil},
		{"k", fn, 3, nil},
		{"five", fn, 5, nil},
		{"none", fn, 0, nil},
		{"zero", func(string) int64 { return 0 }, 0, nil},
		{"neg", fn, 0, tierlimit.ErrInvalidLimit},
		{"huge", fn, 0, tierlimit.ErrInvalidLimit},
		{"", nil, 0, tierlimit.ErrInvalidKey},
		{strings.Repeat("x", tierlimit.MaxKeyLen+1), nil, 0, tierlimit.ErrInvalidKey},
	} {
		got, err := Limit(tt.key, 3, tt.fn)
		if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("Limit(%.10q) = %d, %v; want %d, %v", tt.key, got, err, tt.want, tt.err)
		}
	}
}

func TestReady(t *testing.T) {
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"background", context.Background(), nil},
		{"past", past, context.DeadlineExceeded},
		{"cancelled", done, context.Canceled},
		{"nil", nil, tierlimit.ErrInvalidOption},
	} {
		if err := Ready(tt.ctx); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("Ready(%s) = %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestQueue: wake-ups go to the longest waiter first, one per Wake, and a
// waiter that leaves passes an unused wake-up on.
func TestQueue(t *testing.T) {
	var q Queue
	a, b, c := q.Join("k"), q.Join("k"), q.Join("k")
	q.Wake("k")
	q.Wake("k")
	if len(a) != 1 || len(b) != 1 || len(c) != 0 {
		t.Fatalf("after two Wakes: a %d, b %d, c %d wake-ups; want 1, 1, 0", len(a), len(b), len(c))
	}
	q.Leave("k", b) // b's wake-up unused: passed to c
	if len(c) != 1 {
		t.Errorf("c has %d wake-ups after b left with one, want 1", len(c))
	}
	<-a
	q.Leave("k", a)
	<-c
	q.Leave("k", c)
	if len(q.m) != 0 {
		t.Errorf("queue keeps %d keys after every waiter left, want 0", len(q.m))
	}
	q.Wake("none") // no waiter: nothing
}
