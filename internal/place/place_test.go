package place

import (
	"errors"
	"runtime"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TestTake: a limiter whose limit differs from a live one's at a position
// both use is refused; one whose positions agree (an extra the other
// lacks), one of another family or prefix, and one after the other's
// Drop or after it was dropped by the program, are not.
func TestTake(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	type owner struct{ _ [16]byte }
	a := &owner{}
	ha, err := Take(a, "first", rdb, "p:", "tb", []string{"10/1s", "5/1h"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name           string
		prefix, family string
		limits         []string
		refused        bool
	}{
		{"another default", "p:", "tb", []string{"100/1s"}, true},
		{"another extra", "p:", "tb", []string{"10/1s", "6/1h"}, true},
		{"the same default alone", "p:", "tb", []string{"10/1s"}, false},
		{"one more extra", "p:", "tb", []string{"10/1s", "5/1h", "1/24h"}, false},
		{"another family", "p:", "gcra", []string{"100/1s"}, false},
		{"another prefix", "q:", "tb", []string{"100/1s"}, false},
	} {
		h, err := Take(&owner{}, "second", rdb, c.prefix, c.family, c.limits)
		if got := errors.Is(err, tierlimit.ErrMisconfigured); got != c.refused {
			t.Errorf("%s: Take = %v, want refused %v", c.name, err, c.refused)
		}
		if h != nil {
			h.Drop()
		}
	}
	ha.Drop()
	ha.Drop() // twice is fine
	if h, err := Take(&owner{}, "second", rdb, "p:", "tb", []string{"100/1s"}); err != nil {
		t.Errorf("Take after the first's Drop = %v, want nil", err)
	} else {
		h.Drop()
	}
	b := &owner{}
	if _, err := Take(b, "first", rdb, "p:", "tb", []string{"10/1s"}); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(b)
	b = nil
	if h, err := Take(&owner{}, "second", rdb, "p:", "tb", []string{"100/1s"}); err != nil {
		t.Errorf("Take after the first was dropped = %v, want nil", err)
	} else {
		h.Drop()
	}
	runtime.KeepAlive(a)
}
