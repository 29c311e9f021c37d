package hybrid

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// holdReply is a go-redis hook that, once armed, holds the reply of the
// next script call for a while after Redis has run it: the window in which
// a claim has debited Redis but not yet deposited its tokens.
type holdReply struct {
	armed   atomic.Bool
	debited chan struct{}
}

func (h *holdReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && err == nil && h.armed.CompareAndSwap(true, false) {
			close(h.debited)
			time.Sleep(100 * time.Millisecond)
		}
		return err
	}
}

// TestResetDuringClaim runs Reset while a claim has debited Redis but not
// yet deposited its tokens. Reset's DEL erases that debit, so those tokens
// must be neither spent nor refunded after it. FuzzOps found the minting
// this prevents; this pins the interleaving down. The test then drains the
// bucket below full, so that a refund of erased tokens cannot hide behind
// the capacity cap.
func TestResetDuringClaim(t *testing.T) {
	e := newEnv(t)
	hold := &holdReply{debited: make(chan struct{})}
	e.rdb.AddHook(hold)
	limit := tierlimit.PerHour(100)
	l := e.limiter(t, limit, WithLeaseBounds(10, 10))

	hold.armed.Store(true)
	var wg sync.WaitGroup
	var first tierlimit.Result
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, _ = l.Allow(e.ctx, "a") // claims 10, held up after the debit
	}()
	<-hold.debited
	if err := l.Reset(e.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !first.Allowed {
		t.Fatalf("first call = %+v, want allowed", first)
	}
	if _, err := l.bucket.AllowN(e.ctx, "a", 50); err != nil {
		t.Fatal(err)
	}
	// The first call spent a token either of the claim before the Reset
	// (erased with it) or of a second claim after it (which counts).
	var after int64
	if s := l.Stats(); s.Leased == 20 {
		after = 1
	} else if s.Leased != 10 {
		t.Fatalf("leased %d, want 10 or 20", s.Leased)
	}
	e.closeAndAudit(t, l, 1, map[string]int64{"a": 50 + after})
}
