package perlimit

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

func TestCache(t *testing.T) {
	var c Cache[*int]
	made := 0
	mk := func() (*int, error) { made++; v := made; return &v, nil }
	a, err := c.Get(tierlimit.PerSecond(1), mk)
	if err != nil || *a != 1 {
		t.Fatalf("first Get = %v, %v; want 1", *a, err)
	}
	if b, _ := c.Get(tierlimit.PerSecond(1), mk); b != a || made != 1 {
		t.Errorf("second Get made %d values, or returned another: want the first", made)
	}
	bad := errors.New("bad limit")
	if _, err := c.Get(tierlimit.PerSecond(2), func() (*int, error) { return nil, bad }); err != bad {
		t.Errorf("Get with a failing build = %v, want its error", err)
	}
	for i := range Max + 10 {
		c.Get(tierlimit.Limit{Rate: int64(i + 10), Period: time.Second}, mk)
	}
	n := 0
	c.Each(func(tierlimit.Limit, *int) { n++ })
	if n != Max {
		t.Errorf("the cache keeps %d values after %d limits, want Max, %d", n, Max+11, Max)
	}
	if v, _ := c.Get(tierlimit.PerSecond(1), mk); v != a {
		t.Error("a value kept before the cache filled up is gone")
	}
	v1, _ := c.Get(tierlimit.PerHour(7), mk)
	if v2, _ := c.Get(tierlimit.PerHour(7), mk); v1 == v2 {
		t.Error("a limit past Max is kept")
	}
}

// TestCacheConcurrent: callers racing on one limit get one value.
func TestCacheConcurrent(t *testing.T) {
	var c Cache[*int]
	var wg sync.WaitGroup
	got := make([]*int, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _ = c.Get(tierlimit.PerSecond(5), func() (*int, error) { return new(int), nil })
		}()
	}
	wg.Wait()
	for _, v := range got[1:] {
		if v != got[0] {
			t.Fatal("two callers of one limit got different values")
		}
	}
}
