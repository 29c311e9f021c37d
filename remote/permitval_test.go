package remote

import (
	"testing"

	"github.com/tierlimit/tierlimit/internal/permit/permittest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

func TestPermitRelease(t *testing.T) {
	c, err := NewConcurrency(redistest.Start(t).Client(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	permittest.Release(t, c, "k")
}
