package store

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TestNewNilClient: a nil client, typed or not, is ErrInvalidOption, not a
// panic inside go-redis.
func TestNewNilClient(t *testing.T) {
	for _, rdb := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		for _, alg := range Algorithms {
			if l, err := New(rdb, alg, tierlimit.PerSecond(1), Config{}); !errors.Is(err, tierlimit.ErrInvalidOption) || l != nil {
				t.Errorf("New(%T, %s) = %v, %v; want nil, ErrInvalidOption", rdb, alg.Name(), l, err)
			}
		}
	}
}
