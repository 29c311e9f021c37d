package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/remote"
)

// TestGivenBackCounted: behind httplimit, a request the second limiter
// refuses is given back to the first, which admitted it: the first's
// metrics count those admissions as given_back, so that allowed −
// given_back is what its clients were really admitted, per source and
// per limit.
func TestGivenBackCounted(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := mustNew(t)
	ip, err := remote.NewTokenBucket(rdb, tierlimit.PerMinute(100), remote.WithObserver(c.Observer("ip")))
	if err != nil {
		t.Fatal(err)
	}
	user, err := remote.NewGCRA(rdb, tierlimit.PerMinute(3), remote.WithObserver(c.Observer("user")))
	if err != nil {
		t.Fatal(err)
	}
	m, err := httplimit.New(ip, httplimit.WithName("ip"),
		httplimit.WithLimiter("user", user, httplimit.KeyHeader("X-User")))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	admitted := 0
	for range 10 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("X-User", "u1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d of 10, want 3 (user's limit)", admitted)
	}
	allowed := testutil.ToFloat64(c.decisions.WithLabelValues("ip", "remote", "allowed"))
	givenBack := testutil.ToFloat64(c.decisions.WithLabelValues("ip", "remote", "given_back"))
	if allowed != 10 || givenBack != 7 {
		t.Errorf("ip: allowed %v, given_back %v; want 10, 7 (allowed − given_back = the 3 admitted)", allowed, givenBack)
	}
	label := tierlimit.PerMinute(100).String()
	if got := testutil.ToFloat64(c.byLimit.WithLabelValues("ip", label, "given_back")); got != 7 {
		t.Errorf("ip: tierlimit_limit_decisions_total{limit=%q,result=\"given_back\"} = %v, want 7", label, got)
	}
}

// TestGivenBackCountedHybrid: the same with a hybrid limiter first, whose
// give-backs go to its lease (Source local) or to Redis.
func TestGivenBackCountedHybrid(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := mustNew(t)
	ip, err := hybrid.New(rdb, tierlimit.PerMinute(100), hybrid.WithObserver(c.Observer("ip")))
	if err != nil {
		t.Fatal(err)
	}
	defer ip.Close()
	user, err := remote.NewGCRA(rdb, tierlimit.PerMinute(3))
	if err != nil {
		t.Fatal(err)
	}
	m, err := httplimit.New(ip, httplimit.WithName("ip"), httplimit.WithLimiter("user", user, httplimit.KeyHeader("X-User")))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	admitted := 0
	for range 10 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("X-User", "u1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	// hybrid may deny a call whose claim ran past its budget (under -race):
	// what is checked is that allowed − given_back is what was admitted.
	var allowed, givenBack float64
	for _, src := range []string{"local", "remote", "blocked", "fallback"} {
		allowed += testutil.ToFloat64(c.decisions.WithLabelValues("ip", src, "allowed"))
		givenBack += testutil.ToFloat64(c.decisions.WithLabelValues("ip", src, "given_back"))
	}
	if admitted != 3 || allowed-givenBack != float64(admitted) || givenBack == 0 {
		t.Errorf("ip: allowed %v, given_back %v, %d admitted; want 3 admitted, allowed − given_back = admitted, some given back", allowed, givenBack, admitted)
	}
}
