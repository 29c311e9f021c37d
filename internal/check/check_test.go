package check

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/tierlimit/tierlimit"
)

func TestKey(t *testing.T) {
	long := string(make([]byte, tierlimit.MaxKeyLen+1))
	for _, c := range []struct {
		key  string
		want error
	}{
		{"", tierlimit.ErrInvalidKey},
		{long, tierlimit.ErrInvalidKey},
		{long[1:], nil},
		{"k", nil},
		{"\x00{}:;", nil}, // any bytes
	} {
		if err := Key(c.key); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Key(%d bytes) = %v, want %v", len(c.key), err, c.want)
		}
	}
}

func TestTakes(t *testing.T) {
	many := make([]tierlimit.Take, tierlimit.MaxTakes+1)
	for i := range many {
		many[i] = tierlimit.Take{Key: "k" + strconv.Itoa(i), N: 1}
	}
	for _, c := range []struct {
		name  string
		takes []tierlimit.Take
		want  []tierlimit.Take
		err   error
	}{
		{"one", []tierlimit.Take{{Key: "a", N: 2}}, []tierlimit.Take{{Key: "a", N: 2}}, nil},
		{"merged in first-seen order", []tierlimit.Take{{Key: "b", N: 1}, {Key: "a", N: 2}, {Key: "b", N: 3}},
			[]tierlimit.Take{{Key: "b", N: 4}, {Key: "a", N: 2}}, nil},
		{"zero takes", []tierlimit.Take{{Key: "a", N: 0}}, []tierlimit.Take{{Key: "a", N: 0}}, nil},
		{"most keys", many[:tierlimit.MaxTakes], many[:tierlimit.MaxTakes], nil},
		{"none", nil, nil, tierlimit.ErrInvalidCost},
		{"empty key", []tierlimit.Take{{Key: "a", N: 1}, {Key: "", N: 1}}, nil, tierlimit.ErrInvalidKey},
		{"negative", []tierlimit.Take{{Key: "a", N: -1}}, nil, tierlimit.ErrInvalidCost},
		{"overflow", []tierlimit.Take{{Key: "a", N: math.MaxInt64}, {Key: "a", N: 1}}, nil, tierlimit.ErrInvalidCost},
		{"too many keys", many, nil, tierlimit.ErrInvalidCost},
	} {
		got, err := Takes(c.takes)
		if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) || !slices.Equal(got, c.want) {
			t.Errorf("%s: Takes = %v, %v; want %v, %v", c.name, got, err, c.want, c.err)
		}
	}
}

func TestNamed(t *testing.T) {
	bad := fmt.Errorf("%w: empty", tierlimit.ErrInvalidKey)
	for _, c := range []struct {
		err  error
		want string
	}{
		{bad, "remote: tierlimit: invalid key: empty"},
		{fmt.Errorf("remote: %w", bad), "remote: tierlimit: invalid key: empty"},
		{context.Canceled, context.Canceled.Error()},
		{tierlimit.ErrClosed, tierlimit.ErrClosed.Error()},
	} {
		got := Named("remote", c.err)
		if got.Error() != c.want || !errors.Is(got, c.err) {
			t.Errorf("Named(remote, %q) = %q, want %q wrapping it", c.err, got, c.want)
		}
	}
	if Named("remote", nil) != nil {
		t.Error("Named(remote, nil) != nil")
	}
	if got := Named("remote", context.Canceled); got != context.Canceled {
		t.Errorf("Named(remote, context.Canceled) = %#v, want context.Canceled itself", got)
	}
}

// TestLookup: a lookup's failure is an error wrapping ErrLimitLookup and
// the lookup's own error (fail closed), or the default when the lookup
// fails open; bad combinations of options are ErrInvalidOption.
func TestLookup(t *testing.T) {
	errDown := errors.New("plans down")
	plan := tierlimit.PerMinute(7)
	ok := func(string) (tierlimit.Limit, error) { return plan, nil }
	failing := func(string) (tierlimit.Limit, error) { return tierlimit.PerSecond(1), errDown }
	fn := func(string) tierlimit.Limit { return plan }
	tests := []struct {
		name    string
		f       tierlimit.LimitFunc
		lookup  tierlimit.LimitLookup
		open    bool
		want    tierlimit.Limit
		wantErr []error // nil: no error
	}{
		{"LimitFunc", fn, nil, false, plan, nil},
		{"lookup answers", nil, ok, false, plan, nil},
		{"lookup answers, fail open", nil, ok, true, plan, nil},
		{"lookup fails closed", nil, failing, false, tierlimit.Limit{}, []error{tierlimit.ErrLimitLookup, errDown}},
		{"lookup fails open", nil, failing, true, tierlimit.Limit{}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lk, err := NewLookup(tc.f, tc.lookup, tc.open)
			if err != nil {
				t.Fatal(err)
			}
			if !lk.Set() {
				t.Fatal("Set() = false, want true")
			}
			got, err := lk.Limit("k")
			if got != tc.want {
				t.Errorf("Limit(k) = %v, want %v", got, tc.want)
			}
			if tc.wantErr == nil && err != nil {
				t.Errorf("Limit(k) error %v, want none", err)
			}
			for _, target := range tc.wantErr {
				if !errors.Is(err, target) {
					t.Errorf("Limit(k) error %v, want one wrapping %v", err, target)
				}
			}
		})
	}
	for _, bad := range []struct {
		name   string
		f      tierlimit.LimitFunc
		lookup tierlimit.LimitLookup
		open   bool
	}{
		{"both", fn, ok, false},
		{"fail open without a lookup", nil, nil, true},
		{"fail open with a LimitFunc", fn, nil, true},
	} {
		if _, err := NewLookup(bad.f, bad.lookup, bad.open); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("NewLookup of %s: error %v, want ErrInvalidOption", bad.name, err)
		}
	}
	if lk, err := NewLookup(nil, nil, false); err != nil || lk.Set() {
		t.Errorf("NewLookup(nil, nil, false) = Set %v, %v; want not Set, no error", lk.Set(), err)
	}
}
