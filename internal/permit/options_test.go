package permit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
)

type option interface{ set(*int) error }

type setTo int

func (v setTo) set(p *int) error {
	if v < 0 {
		return errors.New("negative")
	}
	*p = int(v)
	return nil
}

func TestOptions(t *testing.T) {
	var got int
	apply := func(o option) error { return o.set(&got) }
	if err := Apply([]option{setTo(1), setTo(2)}, apply); err != nil || got != 2 {
		t.Errorf("Apply(1, 2) = %v, set %d; want nil, 2", err, got)
	}
	if err := Apply([]option{setTo(3), nil, setTo(4)}, apply); !errors.Is(err, tierlimit.ErrInvalidOption) || got != 3 {
		t.Errorf("Apply(3, nil, 4) = %v, set %d; want ErrInvalidOption, 3", err, got)
	}
	if err := Apply([]option{setTo(-1)}, apply); err == nil || err.Error() != "negative" {
		t.Errorf("Apply(-1) = %v, want the option's error", err)
	}
	if _, err := Observer(nil); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("Observer(nil) = %v, want ErrInvalidOption", err)
	}
	if f, err := Observer(&tierlimit.Observer{Permit: func(tierlimit.PermitDecision) {}}); f == nil || err != nil {
		t.Errorf("Observer(o) = %v, nil func %v; want o.Permit, nil", err, f == nil)
	}
	if _, err := Func(nil); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("Func(nil) = %v, want ErrInvalidOption", err)
	}
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	if _, err := Check(ctx, "x", true, "k", 1, nil); err != tierlimit.ErrClosed {
		t.Errorf("Check of a closed limiter = %v, want ErrClosed", err)
	}
	if n, err := Check(ctx, "x", false, "k", 3, nil); n != 3 || err != nil {
		t.Errorf("Check = %d, %v; want 3, nil", n, err)
	}
	if _, err := Check(ctx, "x", false, "", 3, nil); !errors.Is(err, tierlimit.ErrInvalidKey) || !strings.HasPrefix(err.Error(), "x: ") {
		t.Errorf("Check of an empty key = %v, want x: ErrInvalidKey", err)
	}
}

func TestCheckRedis(t *testing.T) {
	if err := CheckRedis(0, true); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("CheckRedis(0, no client) = %v, want ErrInvalidLimit first", err)
	}
	if err := CheckRedis(1, true); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("CheckRedis(1, no client) = %v, want ErrInvalidOption", err)
	}
	if err := CheckRedis(1, false); err != nil {
		t.Errorf("CheckRedis(1, a client) = %v, want nil", err)
	}
}

func TestTakeID(t *testing.T) {
	var s Slab[string]
	i, gen := s.Put("a")
	if _, ok := s.TakeID(uint64(i)|1<<32, gen); ok {
		t.Error("TakeID of an id over 32 bits = true, want false")
	}
	if v, ok := s.TakeID(uint64(i), gen); !ok || v != "a" {
		t.Errorf("TakeID = %q, %v; want a, true", v, ok)
	}
}
