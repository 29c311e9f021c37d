package local_test

import (
	"context"
	"fmt"

	"github.com/tierlimit/tierlimit/local"
)

// ExampleNewConcurrency limits a key to two requests in flight.
func ExampleNewConcurrency() {
	conc, err := local.NewConcurrency(2)
	if err != nil {
		panic(err)
	}
	defer conc.Close()
	ctx := context.Background()
	for i := range 3 {
		p, ok, err := conc.TryAcquire(ctx, "user:42")
		fmt.Println(i, ok, err)
		if i == 2 {
			break
		}
		defer p.Release()
	}
	// Output:
	// 0 true <nil>
	// 1 true <nil>
	// 2 false <nil>
}
