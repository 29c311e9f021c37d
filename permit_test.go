package tierlimit_test

import (
	"errors"
	"testing"

	"github.com/tierlimit/tierlimit"
)

func TestCheckPermits(t *testing.T) {
	for _, tt := range []struct {
		n    int64
		want error
	}{
		{-1, tierlimit.ErrInvalidLimit},
		{0, tierlimit.ErrInvalidLimit},
		{1, nil},
		{tierlimit.MaxPermits, nil},
		{tierlimit.MaxPermits + 1, tierlimit.ErrInvalidLimit},
	} {
		if err := tierlimit.CheckPermits(tt.n); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("CheckPermits(%d) = %v, want %v", tt.n, err, tt.want)
		}
	}
}
