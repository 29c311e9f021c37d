package permittest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// The fleet: members are the calling package's test binary run again as
// OS processes (its TestPermitMember, which calls Member), each with 32
// goroutines holding permits of one key for 1-50 ms, each checking a
// counter in Redis the test owns.

// Tier is what the fleet tests need of a tier's Concurrency.
type Tier struct {
	// New returns a limiter of n permits per key on rdb, with a permit
	// TTL of ttl (0: the tier's default).
	New func(rdb *redis.Client, n int64, ttl time.Duration) (Limiter, error)
	// HoldWait: a holding member takes its permits with Acquire (waiting
	// up to 5 s each), not TryAcquire.
	HoldWait bool
}

const memberEnv = "TIERLIMIT_PERMIT_MEMBER"

type memberSpec struct {
	Addr     string
	N        int64
	TTL      time.Duration
	Duration time.Duration
	Hold     bool // hold N permits and sleep until killed
	Times    bool // record each permit's time in flight (runTimed)
}

type memberReport struct {
	Acquired, Over int64
	Errors         []string
}

// Member is the body of a package's TestPermitMember: in a process
// startMember ran, it runs as a fleet member of tier; elsewhere it skips.
func Member(t *testing.T, tier Tier) {
	raw := os.Getenv(memberEnv)
	if raw == "" {
		t.Skip("run as a fleet member only")
	}
	var spec memberSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: spec.Addr})
	c, err := tier.New(rdb, spec.N, spec.TTL)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Hold {
		for range spec.N {
			if tier.HoldWait {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := c.Acquire(ctx, "k"); err != nil {
					t.Fatalf("Acquire = %v", err)
				}
				cancel()
			} else if _, ok, err := c.TryAcquire(context.Background(), "k"); !ok || err != nil {
				t.Fatalf("TryAcquire = %v, %v", ok, err)
			}
		}
		fmt.Println("held")
		time.Sleep(time.Minute)
	}
	if spec.Times {
		fmt.Println("ready")
		rep := runTimed(c, spec.Duration)
		out, _ := json.Marshal(rep)
		fmt.Println(string(out))
		c.Close()
		return
	}
	rep := runMember(c, rdb, spec.N, spec.Duration)
	c.Close()
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
}

// runMember runs 32 goroutines on c until d has passed.
func runMember(c Limiter, rdb *redis.Client, n int64, d time.Duration) memberReport {
	var rep memberReport
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10_000 && time.Now().Before(end); i++ {
				ctx, cancel := context.WithDeadline(context.Background(), end)
				p, err := c.Acquire(ctx, "k")
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						rep.Errors = append(rep.Errors, err.Error())
						mu.Unlock()
					}
					return
				}
				in := rdb.Incr(context.Background(), "inflight").Val()
				mu.Lock()
				rep.Acquired++
				if in > n {
					rep.Over++
				}
				mu.Unlock()
				time.Sleep(time.Duration(1+rand.N(50)) * time.Millisecond)
				rdb.Decr(context.Background(), "inflight")
				p.Release()
			}
		}()
	}
	wg.Wait()
	return rep
}

// startMember runs this binary as a fleet member.
func startMember(t *testing.T, spec memberSpec) *exec.Cmd {
	t.Helper()
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPermitMember$", "-test.v")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	return cmd
}

// Fleet runs fleets of 3 members of N = 1 for 2 s and N = 5 for 3 s:
// no member may find more than N in flight, or get an error but its
// deadline, and the fleet must acquire at least 10·N a second.
func Fleet(t *testing.T) {
	srv := redistest.Start(t)
	for _, tt := range []struct {
		n int64
		d time.Duration
	}{{1, 2 * time.Second}, {5, 3 * time.Second}} {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			srv.Client(t).Del(context.Background(), "inflight")
			spec := memberSpec{Addr: srv.Client(t).Options().Addr, N: tt.n, Duration: tt.d}
			var wg sync.WaitGroup
			reports := make([]memberReport, 3)
			for i := range reports {
				cmd := startMember(t, spec)
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := cmd.Output()
					if err != nil {
						t.Errorf("member %d: %v", i, err)
						return
					}
					reports[i] = lastReport(t, out)
				}()
			}
			wg.Wait()
			var acquired int64
			for i, r := range reports {
				if r.Over != 0 || len(r.Errors) != 0 {
					t.Errorf("member %d: %d acquisitions found more than %d in flight, errors %v; want none", i, r.Over, tt.n, r.Errors)
				}
				acquired += r.Acquired
			}
			// n permits held 25.5 ms on average: about 39·n a second if no
			// time is lost between holders.
			if min := 10 * tt.n * int64(tt.d/time.Second); acquired < min {
				t.Errorf("fleet acquired %d permits in %v, want at least %d", acquired, tt.d, min)
			}
			t.Logf("fleet acquired %d permits of N = %d in %v", acquired, tt.n, tt.d)
		})
	}
}

// lastReport decodes a member's report, its last line that is JSON.
func lastReport(t *testing.T, out []byte) memberReport {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var r memberReport
		if json.Unmarshal([]byte(lines[i]), &r) == nil {
			return r
		}
	}
	t.Fatalf("member printed no report: %s", out)
	return memberReport{}
}

// KilledHolder checks that a SIGKILLed member holding all 3 permits of a
// key, with a TTL of 300 ms, has them free within TTL plus one renewal
// interval (and 100 ms).
func KilledHolder(t *testing.T, tier Tier) {
	rdb := redistest.Start(t).Client(t)
	const n, ttl = 3, 300 * time.Millisecond
	cmd := startMember(t, memberSpec{Addr: rdb.Options().Addr, N: n, TTL: ttl, Hold: true})
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() // on every path: it would sleep a minute
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "held" {
	}
	if lines.Text() != "held" {
		cmd.Process.Kill()
		t.Fatalf("member said %q, want held", lines.Text())
	}
	c, _ := tier.New(rdb, n, ttl)
	defer c.Close()
	time.Sleep(ttl) // the member renews meanwhile
	if _, ok, _ := c.TryAcquire(context.Background(), "k"); ok {
		t.Fatal("TryAcquire while the member holds every permit = true, want false")
	}
	cmd.Process.Kill()
	killed := time.Now()
	cmd.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range n {
		if _, err := c.Acquire(ctx, "k"); err != nil {
			t.Fatalf("Acquire %d after the kill: %v", i, err)
		}
	}
	if d, bound := time.Since(killed), ttl+ttl/3+100*time.Millisecond; d > bound {
		t.Errorf("the killed holder's %d permits were free after %v, want within %v (TTL + a renewal + 100 ms)", n, d, bound)
	} else {
		t.Logf("free %v after the kill", d)
	}
}
