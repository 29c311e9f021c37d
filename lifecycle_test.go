package tierlimit_test

// Close racing every other call, on every tier that has a Close: in a child
// process, so that a panic or a caller blocked forever is caught and
// reported instead of killing or hanging the suite.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// lifecycleEnv names the tier a child process of TestCloseRaces stresses.
const lifecycleEnv = "TIERLIMIT_LIFECYCLE_CHILD"

// TestCloseRaces runs rounds of Close racing AllowN, Reset, Stats and Close
// itself in a child process per tier. In every round: no panic, no call
// blocked past the round, every call that starts after Close returned gets
// tierlimit.ErrClosed, and (hybrid) no token stays held: the ledger
// balances with Held 0, tokens claimed while Close ran included.
func TestCloseRaces(t *testing.T) {
	s := redistest.Start(t)
	rounds := 300
	if raceEnabled {
		rounds = 100
	}
	for _, tr := range tiers {
		if !tr.closable {
			continue
		}
		tier := tr.name
		t.Run(tier, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), lifecycleEnv+"="+tier, "TIERLIMIT_LIFECYCLE_ADDR="+s.Addr,
				"TIERLIMIT_LIFECYCLE_ROUNDS="+strconv.Itoa(rounds))
			// A hung child is asked for its goroutines' stacks first.
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
			cmd.WaitDelay = 5 * time.Second
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if err != nil {
				t.Fatalf("%d rounds of Close racing the %s limiter's calls: %v\n%s", rounds, tier, err, tail(out.String(), 8000))
			}
			t.Logf("%s", bytes.TrimSpace(out.Bytes()))
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// lifecycleChild runs the rounds of TestCloseRaces for the tier named
// name and returns the process's exit code.
func lifecycleChild(name string) int {
	tier, ok := tierNamed(name)
	if !ok {
		fmt.Printf("no tier %q\n", name)
		return 2
	}
	rounds, _ := strconv.Atoi(os.Getenv("TIERLIMIT_LIFECYCLE_ROUNDS"))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("TIERLIMIT_LIFECYCLE_ADDR")})
	defer rdb.Close()
	var callsAfter, closedErrs int
	for round := range rounds {
		l, err := tier.new(rdb, tierlimit.PerSecond(1000), tierOptions{
			prefix: "lifecycle:" + strconv.Itoa(round) + ":", leaseTTL: 20 * time.Millisecond, maxKeys: 64})
		if err != nil {
			fmt.Println(err)
			return 2
		}
		var stats func() hybrid.Stats
		if h, ok := l.(*hybrid.Limiter); ok {
			stats = h.Stats
		}
		after, errs, err := raceClose(l, stats)
		if err != nil {
			fmt.Printf("round %d: %v\n", round, err)
			return 1
		}
		callsAfter += after
		closedErrs += errs
		if stats != nil {
			st := stats()
			if st.Held != 0 || st.Leased != st.Spent+st.Refunded+st.Lost {
				fmt.Printf("round %d: after Close, %+v: tokens held or the ledger does not balance\n", round, st)
				return 1
			}
		}
	}
	fmt.Printf("%d rounds: %d calls started after Close returned, every one ErrClosed; %d ErrClosed in all\n",
		rounds, callsAfter, closedErrs)
	return 0
}

// raceClose runs callers of l's methods, closes l (twice, concurrently)
// while they run, and checks what they got. It returns the calls started
// after Close returned and the ErrClosed seen.
func raceClose(l limiter, stats func() hybrid.Stats) (after, closedErrs int, err error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		closedAt time.Time
		firstErr error
	)
	isClosed := func() (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		return closedAt, !closedAt.IsZero()
	}
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = fmt.Errorf(format, args...)
		}
	}
	ctx := context.Background()
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				key := "k" + strconv.Itoa(rand.IntN(50))
				_, wasClosed := isClosed()
				var err error
				switch {
				case g == 0 && i%10 == 0:
					err = l.Reset(ctx, key)
				case g == 1 && stats != nil && i%10 == 0:
					stats() // no error to check: Stats reads counters, closed or not
					continue
				default:
					_, err = l.AllowN(ctx, key, 1+int64(rand.IntN(3)))
				}
				switch {
				case errors.Is(err, tierlimit.ErrClosed):
					mu.Lock()
					closedErrs++
					if wasClosed {
						after++
					}
					mu.Unlock()
					if wasClosed {
						return
					}
				case err != nil:
					fail("a call got %v", err)
					return
				case wasClosed:
					fail("a call started after Close returned got no error")
					return
				}
			}
		}()
	}
	time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
	var closers sync.WaitGroup
	for range 2 {
		closers.Add(1)
		go func() {
			defer closers.Done()
			if err := l.Close(); err != nil {
				fail("Close: %v", err)
			}
		}()
	}
	closers.Wait()
	mu.Lock()
	closedAt = time.Now()
	mu.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return after, closedErrs, errors.New("callers still blocked 30 s after Close returned")
	}
	return after, closedErrs, firstErr
}
