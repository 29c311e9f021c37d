package httplimit

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logtest"
)

// ok is the handler behind the middleware in the tests.
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "ok")
})

func mustNew(t testing.TB, lim tierlimit.Limiter, opts ...Option) *Middleware {
	t.Helper()
	m, err := New(lim, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// sfItem is one member of a RateLimit or RateLimit-Policy field, as a
// structured-field parser reads it.
type sfItem struct {
	name   string
	params map[string]any // int64, string or []byte
}

// parseField parses field name of h as a structured-field List (RFC 9651)
// of String items with the parameters the draft defines: Integers, but qu
// a String and pk a Byte Sequence.
func parseField(t *testing.T, h http.Header, name string) []sfItem {
	t.Helper()
	vals := h.Values(name)
	if len(vals) == 0 {
		t.Fatalf("no %s field", name)
	}
	list, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		t.Fatalf("%s: %q does not parse as a structured-field list: %v", name, vals, err)
	}
	var items []sfItem
	for _, m := range list {
		it, isItem := m.(httpsfv.Item)
		if !isItem {
			t.Fatalf("%s: member %#v is not an item", name, m)
		}
		s, isString := it.Value.(string)
		if !isString {
			t.Fatalf("%s: item value %#v is not a String", name, it.Value)
		}
		item := sfItem{name: s, params: map[string]any{}}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			var typeOK bool
			switch k {
			case "qu":
				_, typeOK = v.(string)
			case "pk":
				_, typeOK = v.([]byte)
			default:
				_, typeOK = v.(int64)
			}
			if !typeOK {
				t.Fatalf("%s: parameter %s=%#v has the wrong type", name, k, v)
			}
			item.params[k] = v
		}
		items = append(items, item)
	}
	return items
}

func (it sfItem) String() string {
	keys := make([]string, 0, len(it.params))
	for k := range it.params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%q", it.name)
	for _, k := range keys {
		switch v := it.params[k].(type) {
		case string:
			fmt.Fprintf(&b, ";%s=%q", k, v)
		case []byte:
			fmt.Fprintf(&b, ";%s=:%s:", k, base64.StdEncoding.EncodeToString(v))
		default:
			fmt.Fprintf(&b, ";%s=%d", k, v)
		}
	}
	return b.String()
}

// checkField checks that field name of h parses to want, written as
// items' String forms joined by ", ".
func checkField(t *testing.T, h http.Header, name, want string) {
	t.Helper()
	var got []string
	for _, it := range parseField(t, h, name) {
		got = append(got, it.String())
	}
	if g := strings.Join(got, ", "); g != want {
		t.Errorf("%s = %s (raw %q), want %s", name, g, h.Values(name), want)
	}
}

// TestServerAllowThenDeny runs the middleware in a real server: requests
// within the limit pass with the RateLimit fields, the one over it gets 429
// with Retry-After.
func TestServerAllowThenDeny(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(3), 1500*time.Millisecond, 20*time.Second)
	srv := httptest.NewServer(mustNew(t, lim).Handler(ok))
	defer srv.Close()

	for i := range 4 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkField(t, resp.Header, "RateLimit-Policy", `"default:3/1m";q=3;w=60`)
		if i < 3 {
			if resp.StatusCode != http.StatusOK || string(body) != "ok" {
				t.Errorf("request %d: got %d %q, want 200 \"ok\"", i+1, resp.StatusCode, body)
			}
			checkField(t, resp.Header, "RateLimit", fmt.Sprintf(`"default:3/1m";r=%d;t=20`, 2-i))
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				t.Errorf("request %d: Retry-After = %q on an admitted request, want none", i+1, ra)
			}
			continue
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("request %d: got status %d, want 429", i+1, resp.StatusCode)
		}
		if got := resp.Header.Get("Retry-After"); got != "2" {
			t.Errorf("Retry-After = %q, want \"2\" (1.5 s rounded up)", got)
		}
		checkField(t, resp.Header, "RateLimit", `"default:3/1m";r=0;t=2`)
	}
	if got := lim.charged("127.0.0.1"); got != 3 {
		t.Errorf("charged %d to 127.0.0.1, want 3", got)
	}
}

// TestRetryAfterRoundsUp checks Retry-After and t against RetryAfter.
func TestRetryAfterRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		retry time.Duration
		want  string
	}{
		{time.Nanosecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Nanosecond, "2"},
		{59*time.Second + time.Millisecond, "60"},
		{time.Hour, "3600"},
	} {
		lim := newFake(tierlimit.PerHour(1), tc.retry, time.Hour)
		lim.used["192.0.2.1"] = 1
		w := serve(mustNew(t, lim), request("192.0.2.1:1234"))
		if got := w.Header().Get("Retry-After"); got != tc.want || w.Code != http.StatusTooManyRequests {
			t.Errorf("RetryAfter %v: got %d, Retry-After %q; want 429, %q", tc.retry, w.Code, got, tc.want)
		}
		checkField(t, w.Header(), "RateLimit", `"default:1/1h";r=0;t=`+tc.want)
	}
}

func request(remoteAddr string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func serve(m *Middleware, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	m.Handler(ok).ServeHTTP(w, r)
	return w
}

// TestSpoofedXFFIsOneClient sends 1,000 requests through a real server,
// each naming another client in X-Forwarded-For. No proxy is trusted, so
// they are all the one peer.
func TestSpoofedXFFIsOneClient(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(10), time.Second, time.Minute)
	srv := httptest.NewServer(mustNew(t, lim).Handler(ok))
	defer srv.Close()
	admitted := 0
	for i := range 1000 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d, 203.0.113.%d", i%256, (i/256)%256))
		req.Header.Set("Forwarded", fmt.Sprintf("for=198.51.100.%d", i%256))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d of 1000 spoofing requests, want 10", admitted)
	}
	for _, c := range lim.asked() {
		if c.key != "127.0.0.1" {
			t.Fatalf("limiter asked %v, want every key 127.0.0.1", c)
		}
	}
}

// TestClientIP checks the key each request gets, with and without trusted
// proxies, for both proxy headers.
func TestClientIP(t *testing.T) {
	trusted := WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.10")
	fwd := WithProxyHeader("forwarded")
	for _, tc := range []struct {
		name   string
		opts   []Option
		remote string
		header []string
		want   string
	}{
		{"peer", nil, "203.0.113.7:4242", nil, "203.0.113.7"},
		{"untrusted peer ignores XFF", nil, "203.0.113.7:4242", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"untrusted peer ignores XFF even when configured", []Option{trusted}, "203.0.113.7:4242",
			[]string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"trusted proxy", []Option{trusted}, "10.1.2.3:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"right-most untrusted wins over spoofed left", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 10.0.0.9, 192.0.2.10"}, "198.51.100.1"},
		{"several lines are one list", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1", "X-Forwarded-For", "10.0.0.9"}, "198.51.100.1"},
		{"the last line is the right end", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "203.0.113.9, 10.0.0.9"}, "203.0.113.9"},
		{"Forwarded: the last line is the right end", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=198.51.100.1", "Forwarded", "for=203.0.113.9"}, "203.0.113.9"},
		{"spoofed trusted address on the left", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "10.9.9.9, 198.51.100.1"}, "198.51.100.1"},
		{"all trusted: left-most", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "10.0.0.5, 10.0.0.9"}, "10.0.0.5"},
		{"no header: the proxy", []Option{trusted}, "10.1.2.3:80", nil, "10.1.2.3"},
		{"empty elements skipped", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", " , 198.51.100.1 ,, "}, "198.51.100.1"},
		{"port", []Option{trusted}, "10.1.2.3:80", []string{"X-Forwarded-For", "198.51.100.1:5555"}, "198.51.100.1"},
		{"malformed falls back to the peer", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "not-an-ip"}, "10.1.2.3"},
		{"malformed element reached falls back", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "198.51.100.1, unknown, 10.0.0.9"}, "10.1.2.3"},
		{"malformed left of the client is never read", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "garbage;;, 198.51.100.1"}, "198.51.100.1"},
		{"IPv4 with leading zero is malformed", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "198.051.100.1"}, "10.1.2.3"},
		{"XFF ignored when Forwarded is the header", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "198.51.100.1"}, "10.1.2.3"},
		{"Forwarded", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=198.51.100.1;proto=https;by=10.1.2.3"}, "198.51.100.1"},
		{"Forwarded right to left", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for=1.1.1.1, For="198.51.100.1:4711" ;proto=http, for=10.0.0.9`}, "198.51.100.1"},
		{"Forwarded IPv6", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::"},
		{"Forwarded quoted-pair", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for="198.51.100.\1"`}, "198.51.100.1"},
		{"Forwarded empty elements skipped", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=198.51.100.1, ,;, for=10.0.0.9"}, "198.51.100.1"},
		{"Forwarded unknown falls back", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=198.51.100.1, for=unknown"}, "10.1.2.3"},
		{"Forwarded obfuscated falls back", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=_hidden"}, "10.1.2.3"},
		{"Forwarded element without for falls back", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=198.51.100.1, by=10.0.0.1"}, "10.1.2.3"},
		{"Forwarded unterminated quote falls back", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for="198.51.100.1`}, "10.1.2.3"},
		{"Forwarded unquoted IPv6 is malformed", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for=[2001:db8::1]`}, "10.1.2.3"},
		{"Forwarded malformed line left of a proxy's line", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", `for="oops`, "Forwarded", "for=198.51.100.1"}, "198.51.100.1"},
		{"Forwarded all trusted: left-most", []Option{trusted, fwd}, "10.1.2.3:80",
			[]string{"Forwarded", "for=10.0.0.5, for=10.0.0.9"}, "10.0.0.5"},
		{"IPv6 peer masked to /64", nil, "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::"},
		{"IPv6 peer masked to /48", []Option{WithIPv6Prefix(48)}, "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1::"},
		{"IPv6 peer unmasked at /128", []Option{WithIPv6Prefix(128)}, "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2:3:4:5:6"},
		{"IPv6 zone dropped", nil, "[fe80::1:2%eth0]:443", nil, "fe80::"},
		{"IPv4-mapped peer is IPv4", nil, "[::ffff:192.0.2.1]:443", nil, "192.0.2.1"},
		{"IPv4-mapped proxy is trusted", []Option{trusted}, "[::ffff:10.1.2.3]:80",
			[]string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"IPv6 trusted proxy, IPv6 client", []Option{trusted}, "[2001:db8:ffff::1]:80",
			[]string{"X-Forwarded-For", "[2001:db8:aaaa:bbbb:1::2]:1234, 2001:db8:ffff::2"}, "2001:db8:aaaa:bbbb::"},
		{"IPv6 inner zeros merge with the masked tail", nil, "[2001:db8:0:0:1:2:3:4]:443", nil, "2001:db8::"},
		{"IPv6 zeros kept left of a longer masked run", nil, "[2001:0:0:1:2:3:4:5]:443", nil, "2001:0:0:1::"},
		{"IPv6 peer masked to nothing", nil, "[::1]:443", nil, "::"},
		{"IPv6 hex lower case, no leading zeros", nil, "[2001:0DB8:00AB:000C:1:2:3:4]:443", nil, "2001:db8:ab:c::"},
		{"IPv6 prefix inside a group", []Option{WithIPv6Prefix(60)}, "[2001:db8:1:2fff::1]:443", nil, "2001:db8:1:2ff0::"},
		{"IPv6 prefix /1", []Option{WithIPv6Prefix(1)}, "[ffff::1]:443", nil, "8000::"},
		{"IPv6 /128: longest zero run compressed", []Option{WithIPv6Prefix(128)}, "[2001:0:0:1:0:0:0:1]:443", nil, "2001:0:0:1::1"},
		{"IPv6 /128: first of equal runs compressed", []Option{WithIPv6Prefix(128)}, "[2001:db8:0:0:1:0:0:1]:443", nil, "2001:db8::1:0:0:1"},
		{"IPv6 /128: leading run", []Option{WithIPv6Prefix(128)}, "[0:0:1:2:3:4:5:6]:443", nil, "::1:2:3:4:5:6"},
		{"IPv6 /128: one zero group not compressed", []Option{WithIPv6Prefix(128)}, "[2001:db8:0:1:2:3:4:0]:443", nil, "2001:db8:0:1:2:3:4:0"},
		{"IPv6 /128: embedded IPv4 in hex", []Option{WithIPv6Prefix(128)}, "[64:ff9b::192.0.2.1]:443", nil, "64:ff9b::c000:201"},
		{"IPv6 peer without a port", nil, "2001:db8:1:2:3:4:5:6", nil, "2001:db8:1:2::"},
		{"IPv4-mapped client in XFF is IPv4", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "::ffff:198.51.100.1"}, "198.51.100.1"},
		{"IPv6 client in XFF masked, zone dropped", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", "fe80::1:2:3:4%eth0, 10.0.0.9"}, "fe80::"},
		{"IPv4 client in a long XFF", []Option{trusted}, "10.1.2.3:80",
			[]string{"X-Forwarded-For", strings.Repeat("192.0.2.1, ", 20) + "198.51.100.1, 10.0.0.9"}, "198.51.100.1"},
		{"Forwarded IPv6 client behind an IPv6 proxy", []Option{trusted, fwd}, "[2001:db8:ffff::1]:80",
			[]string{"Forwarded", `for="[2001:db8:aaaa:bbbb:1::2]", for="[2001:db8:ffff::2]:443"`}, "2001:db8:aaaa:bbbb::"},
		{"bare address", nil, "192.0.2.1", nil, "192.0.2.1"},
		{"not an address: as it is", nil, "@", nil, "@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := newFake(tierlimit.PerMinute(100), time.Second, time.Second)
			serve(mustNew(t, lim, tc.opts...), request(tc.remote, tc.header...))
			calls := lim.asked()
			if len(calls) != 1 || calls[0].key != tc.want {
				t.Errorf("RemoteAddr %q, header %q: limiter asked %v, want key %q", tc.remote, tc.header, calls, tc.want)
			}
		})
	}
}

// TestNoRemoteAddrIsNotLimited checks that a request with no RemoteAddr
// (no client to key by) is served and not charged.
func TestNoRemoteAddrIsNotLimited(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(1), time.Second, time.Second)
	w := serve(mustNew(t, lim), request(""))
	if w.Code != http.StatusOK || len(lim.asked()) != 0 || w.Header().Get("RateLimit") != "" {
		t.Errorf("got %d, %d calls, RateLimit %q; want 200, no call, no field", w.Code, len(lim.asked()), w.Header().Get("RateLimit"))
	}
}

// TestShadow checks that shadow mode serves every request, charges what
// it admits and reports the denials in the fields.
func TestShadow(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(2), 5*time.Second, time.Minute)
	m := mustNew(t, lim, WithShadow())
	for i := range 5 {
		w := serve(m, request("192.0.2.1:1"))
		if w.Code != http.StatusOK {
			t.Errorf("request %d: got %d, want 200 in shadow mode", i+1, w.Code)
		}
		// The fake's ResetAfter is fixed, not a bucket's: t is ResetAfter
		// for the first, the next token for the second (see
		// TestEffectiveWindow), RetryAfter for the denials.
		want := []string{`"default:2/1m";r=1;t=60`, `"default:2/1m";r=0;t=30`}[min(i, 1)]
		if i >= 2 {
			want = `"default:2/1m";r=0;t=5`
		}
		checkField(t, w.Header(), "RateLimit", want)
		if ra := w.Header().Get("Retry-After"); ra != "" {
			t.Errorf("request %d: Retry-After = %q in shadow mode, want none", i+1, ra)
		}
	}
	if got, calls := lim.charged("192.0.2.1"), len(lim.asked()); got != 2 || calls != 5 {
		t.Errorf("charged %d in %d calls, want 2 in 5", got, calls)
	}
}

// TestSeveralLimiters checks the charging policy and which limiter the
// fields report.
func TestSeveralLimiters(t *testing.T) {
	route := newFake(tierlimit.PerMinute(2), 10*time.Second, 30*time.Second)
	user := newFake(tierlimit.PerHour(3), 20*time.Minute, time.Hour)
	m := mustNew(t, route, WithName("route"), WithLimiter("user", user, KeyHeader("X-API-Key")))
	const ip, key = "192.0.2.1", "k1"
	type want struct {
		code          int
		rateLimit     string
		policy        string
		routeCharged  int64
		userCharged   int64
		lastUserCallN int64
	}
	both := `"route:2/1m";q=2;w=60, "user:3/1h";q=3;w=3600`
	steps := []want{
		{200, `"route:2/1m";r=1;t=30`, both, 1, 1, 1}, // route has 1 left, user 2: route is tighter
		{200, `"route:2/1m";r=0;t=30`, both, 2, 2, 1},
		{429, `"route:2/1m";r=0;t=10`, both, 2, 2, 0}, // route denies: user only peeked, not charged
	}
	for i, s := range steps {
		w := serve(m, request(ip+":1", "X-API-Key", key))
		if w.Code != s.code {
			t.Errorf("step %d: got %d, want %d", i+1, w.Code, s.code)
		}
		checkField(t, w.Header(), "RateLimit", s.rateLimit)
		checkField(t, w.Header(), "RateLimit-Policy", s.policy)
		calls := user.asked()
		if r, u, n := route.charged(ip), user.charged(key), calls[len(calls)-1].n; r != s.routeCharged || u != s.userCharged || n != s.lastUserCallN {
			t.Errorf("step %d: charged route %d, user %d, last user cost %d; want %d, %d, %d",
				i+1, r, u, n, s.routeCharged, s.userCharged, s.lastUserCallN)
		}
	}

	// Without the header, only the route applies.
	route2 := newFake(tierlimit.PerMinute(5), time.Second, time.Second)
	user2 := newFake(tierlimit.PerMinute(5), time.Second, time.Second)
	m2 := mustNew(t, route2, WithName("route"), WithLimiter("user", user2, KeyHeader("X-API-Key")))
	w := serve(m2, request(ip+":1"))
	if len(user2.asked()) != 0 {
		t.Errorf("user limiter asked %v for a request without X-API-Key, want no call", user2.asked())
	}
	checkField(t, w.Header(), "RateLimit-Policy", `"route:5/1m";q=5;w=60`)

	// A later limiter that denies: the earlier one, which has no Settle,
	// keeps its charge, and the longest RetryAfter is reported.
	a := newFake(tierlimit.PerMinute(5), time.Second, time.Minute)
	b := newFake(tierlimit.PerMinute(1), 40*time.Second, time.Minute)
	b.used[ip] = 1
	w = serve(mustNew(t, a, WithName("a"), WithLimiter("b", b, nil)), request(ip+":1"))
	if w.Code != http.StatusTooManyRequests || a.charged(ip) != 1 || w.Header().Get("Retry-After") != "40" {
		t.Errorf("got %d, a charged %d, Retry-After %q; want 429, 1, \"40\"", w.Code, a.charged(ip), w.Header().Get("Retry-After"))
	}
	checkField(t, w.Header(), "RateLimit", `"b:1/1m";r=0;t=40`)
}

// TestMostRestrictive checks the ranking of outcomes directly.
func TestMostRestrictive(t *testing.T) {
	r := []rule{{name: "a", unit: UnitRequests}, {name: "b", unit: UnitRequests}, {name: "c", unit: UnitRequests},
		{name: "d", unit: UnitRequests}, {name: "e", unit: UnitContentBytes}}
	allow := func(rem int64) tierlimit.Result { return tierlimit.Result{Allowed: true, Remaining: rem} }
	deny := func(retry time.Duration) tierlimit.Result { return tierlimit.Result{RetryAfter: retry} }
	for _, tc := range []struct {
		outs []outcome
		want string
	}{
		{[]outcome{{rule: &r[0], res: allow(5)}, {rule: &r[1], res: allow(3)}, {rule: &r[2], res: allow(4)}}, "b"},
		{[]outcome{{rule: &r[0], res: allow(3)}, {rule: &r[1], res: allow(3)}}, "a"},
		{[]outcome{{rule: &r[0], res: allow(0)}, {rule: &r[1], res: deny(time.Second)}}, "b"},
		{[]outcome{{rule: &r[0], res: deny(2 * time.Second)}, {rule: &r[1], res: deny(time.Second)}}, "a"},
		{[]outcome{{rule: &r[0], res: deny(time.Hour)}, {rule: &r[1], never: true}}, "b"},
		// Remaining requests and remaining bytes do not compare.
		{[]outcome{{rule: &r[3], res: allow(5)}, {rule: &r[4], res: allow(3)}}, "d"},
		{[]outcome{{rule: &r[3], res: allow(5)}, {rule: &r[4], res: allow(3)}, {rule: &r[0], res: allow(4)}}, "a"},
		{[]outcome{{rule: &r[3], res: allow(5)}, {rule: &r[4], res: deny(time.Second)}}, "e"},
	} {
		if got := mostRestrictive(tc.outs, "").rule.name; got != tc.want {
			t.Errorf("mostRestrictive(%+v) = %s, want %s", tc.outs, got, tc.want)
		}
	}
}

// TestLimiterErrors checks the error policy.
func TestLimiterErrors(t *testing.T) {
	backend := errors.New("redis: connection refused")
	teapot := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, tc := range []struct {
		name string
		opts []Option
		code int
	}{
		{"fail open by default", nil, http.StatusOK},
		{"fail closed", []Option{WithFailClosed(nil)}, http.StatusServiceUnavailable},
		{"fail closed with a handler", []Option{WithFailClosed(teapot)}, http.StatusTeapot},
		{"shadow never refuses", []Option{WithFailClosed(nil), WithShadow()}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := newFake(tierlimit.PerMinute(1), time.Second, time.Second)
			lim.err = backend
			var seen []error
			opts := append([]Option{WithErrorFunc(func(_ *http.Request, err error) { seen = append(seen, err) })}, tc.opts...)
			w := serve(mustNew(t, lim, opts...), request("192.0.2.1:1"))
			if w.Code != tc.code {
				t.Errorf("got %d, want %d", w.Code, tc.code)
			}
			if len(seen) != 1 || !errors.Is(seen[0], backend) {
				t.Errorf("error func saw %v, want one error wrapping %v", seen, backend)
			}
			if h := w.Header().Get("RateLimit"); h != "" {
				t.Errorf("RateLimit = %q from a failed limiter, want none", h)
			}
		})
	}

	// A failing limiter is left out; the others still decide and show.
	bad := newFake(tierlimit.PerMinute(1), time.Second, time.Second)
	bad.err = backend
	good := newFake(tierlimit.PerMinute(1), 3*time.Second, time.Second)
	m := mustNew(t, bad, WithName("bad"), WithLimiter("good", good, nil))
	for i, want := range []int{200, 429} {
		w := serve(m, request("192.0.2.1:1"))
		if w.Code != want {
			t.Errorf("request %d with one failing limiter: got %d, want %d", i+1, w.Code, want)
		}
		checkField(t, w.Header(), "RateLimit-Policy", `"good:1/1m";q=1;w=60`)
	}
}

// TestLimiterErrorsLogged: without WithErrorFunc, a failing limiter is not
// silent: its errors reach WithLogger's logger, at most one line per
// logEvery, saying which way the middleware fails, and nothing reaches the
// default logger; without WithLogger, the default logger has them.
func TestLimiterErrorsLogged(t *testing.T) {
	logtest.Check(t, 1, []string{"level=WARN", "failing=open", "WRONGPASS"}, func(logger *slog.Logger) {
		lim := newFake(tierlimit.PerMinute(1), time.Second, time.Second)
		lim.err = fmt.Errorf("hybrid: %w: WRONGPASS", tierlimit.ErrMisconfigured)
		var opts []Option
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		m := mustNew(t, lim, opts...)
		for i := 0; i < 100; i++ {
			if w := serve(m, request("192.0.2.1:1")); w.Code != http.StatusOK {
				t.Fatalf("request %d: got %d, want 200 (fail open)", i, w.Code)
			}
		}
	})
}

// TestCost checks that the cost func is asked and passed on, and that a
// cost the limiter can never admit is denied without Retry-After.
func TestCost(t *testing.T) {
	cost := func(r *http.Request) int64 {
		switch r.URL.Path {
		case "/free":
			return 0
		case "/huge":
			return 1000
		}
		return 3
	}
	lim := newFake(tierlimit.PerMinute(10), time.Second, time.Minute)
	var errs []error
	m := mustNew(t, lim, WithCost(cost), WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))
	for _, tc := range []struct {
		path    string
		code    int
		charged int64
		retry   string
	}{
		{"/", 200, 3, ""},
		{"/free", 200, 3, ""},
		{"/huge", 429, 3, ""},
		{"/", 200, 6, ""},
		{"/", 200, 9, ""},
		{"/", 429, 9, "1"},
	} {
		r := request("192.0.2.1:1")
		r.URL.Path = tc.path
		w := serve(m, r)
		if got := lim.charged("192.0.2.1"); w.Code != tc.code || got != tc.charged || w.Header().Get("Retry-After") != tc.retry {
			t.Errorf("GET %s: got %d, charged %d, Retry-After %q; want %d, %d, %q",
				tc.path, w.Code, got, w.Header().Get("Retry-After"), tc.code, tc.charged, tc.retry)
		}
	}
	if len(errs) != 1 || !errors.Is(errs[0], tierlimit.ErrInvalidCost) {
		t.Errorf("error func saw %v, want one ErrInvalidCost", errs)
	}
}

// TestLongKeyHashed checks that a key past tierlimit.MaxKeyLen is hashed
// rather than refused (which would fail open).
func TestLongKeyHashed(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(1), time.Second, time.Second)
	m := mustNew(t, lim, WithKey(KeyHeader("X-API-Key")))
	long := strings.Repeat("k", 5000)
	for i, want := range []int{200, 429} {
		if w := serve(m, request("192.0.2.1:1", "X-API-Key", long)); w.Code != want {
			t.Errorf("request %d with a 5000-byte key: got %d, want %d", i+1, w.Code, want)
		}
	}
	if calls := lim.asked(); len(calls[0].key) != len("sha256:")+64 || !strings.HasPrefix(calls[0].key, "sha256:") {
		t.Errorf("limiter asked key %q, want sha256:<64 hex digits>", calls[0].key)
	}
}

// TestLegacyHeaders checks the X-RateLimit-* headers.
func TestLegacyHeaders(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(10).WithBurst(20), 2*time.Second, 1500*time.Millisecond)
	w := serve(mustNew(t, lim, WithLegacyHeaders()), request("192.0.2.1:1"))
	for k, want := range map[string]string{"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "19", "X-RateLimit-Reset": "2"} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if w := serve(mustNew(t, lim), request("192.0.2.1:1")); w.Header().Get("X-RateLimit-Remaining") != "" {
		t.Errorf("X-RateLimit-Remaining = %q without WithLegacyHeaders, want none", w.Header().Get("X-RateLimit-Remaining"))
	}
}

// TestPolicyNames checks that policy names needing escapes survive a
// structured-field parser.
func TestPolicyNames(t *testing.T) {
	for _, name := range []string{"default", `a"b`, `back\slash`, "with space", "~!#"} {
		lim := newFake(tierlimit.PerSecond(5), time.Second, time.Second)
		w := serve(mustNew(t, lim, WithName(name)), request("192.0.2.1:1"))
		for _, field := range []string{"RateLimit", "RateLimit-Policy"} {
			if items := parseField(t, w.Header(), field); len(items) != 1 || items[0].name != name+":5/1s" {
				t.Errorf("WithName(%q): %s parses to %v, want one item named %q", name, field, items, name+":5/1s")
			}
		}
	}
}

// TestDeniedHandler checks that a custom handler answers denials, with the
// headers already set.
func TestDeniedHandler(t *testing.T) {
	lim := newFake(tierlimit.PerMinute(1), 7*time.Second, time.Minute)
	lim.used["192.0.2.1"] = 1
	var retry string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		retry = w.Header().Get("Retry-After")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	w := serve(mustNew(t, lim, WithDeniedHandler(h)), request("192.0.2.1:1"))
	if w.Code != http.StatusServiceUnavailable || retry != "7" {
		t.Errorf("got %d, handler saw Retry-After %q; want 503, \"7\"", w.Code, retry)
	}
}

// TestQuota checks how limits map to q and w.
func TestQuota(t *testing.T) {
	for _, tc := range []struct {
		l    tierlimit.Limit
		q, w int64
	}{
		{tierlimit.PerMinute(100), 100, 60},
		{tierlimit.PerSecond(5).WithBurst(50), 5, 1},
		{tierlimit.PerDay(1), 1, 86400},
		{tierlimit.Limit{Rate: 10, Period: 100 * time.Millisecond}, 100, 1},
		{tierlimit.Limit{Rate: 3, Period: 1500 * time.Millisecond}, 4, 2},
		{tierlimit.Limit{Rate: 1, Period: time.Microsecond}, 1_000_000, 1},
		{tierlimit.Limit{Rate: 1 << 50, Period: 1 << 50 * time.Microsecond}, maxSFInt, 1_125_899_907}, // q clamped
		{tierlimit.Limit{Rate: 1 << 62, Period: time.Nanosecond}, maxSFInt, 1},                        // invalid, but no panic
	} {
		if q, w := quota(tc.l); q != tc.q || w != tc.w {
			t.Errorf("quota(%v) = %d, %d; want %d, %d", tc.l, q, w, tc.q, tc.w)
		}
	}
}

// TestBadOptions checks that New refuses bad options with typed errors.
func TestBadOptions(t *testing.T) {
	one := func(*http.Request) int64 { return 1 }
	lim := newFake(tierlimit.PerSecond(1), time.Second, time.Second)
	for _, tc := range []struct {
		name string
		lim  tierlimit.Limiter
		opts []Option
	}{
		{"nil limiter", nil, nil},
		{"nil option", lim, []Option{nil}},
		{"empty name", lim, []Option{WithName("")}},
		{"long name", lim, []Option{WithName(strings.Repeat("n", 65))}},
		{"non-ASCII name", lim, []Option{WithName("café")}},
		{"control in name", lim, []Option{WithName("a\nb")}},
		{"duplicate names", lim, []Option{WithLimiter("default", lim, nil)}},
		{"nil extra limiter", lim, []Option{WithLimiter("user", nil, nil)}},
		{"bad CIDR", lim, []Option{WithTrustedProxies("10.0.0.0/33")}},
		{"not an address", lim, []Option{WithTrustedProxies("proxy.internal")}},
		{"unknown proxy header", lim, []Option{WithProxyHeader("X-Real-IP")}},
		{"IPv6 prefix 0", lim, []Option{WithIPv6Prefix(0)}},
		{"IPv6 prefix 129", lim, []Option{WithIPv6Prefix(129)}},
		{"nil key", lim, []Option{WithKey(nil)}},
		{"nil cost", lim, []Option{WithCost(nil)}},
		{"nil denied handler", lim, []Option{WithDeniedHandler(nil)}},
		{"nil error func", lim, []Option{WithErrorFunc(nil)}},
		{"nil logger", lim, []Option{WithLogger(nil)}},
		{"nil decision func", lim, []Option{WithDecisionFunc(nil)}},
		{"limiter cost for no limiter", lim, []Option{WithLimiterCost("user", UnitRequests, one)}},
		{"limiter cost for the old name", lim, []Option{WithLimiterCost("default", UnitRequests, one), WithName("ip")}},
		{"two limiter costs for one", lim, []Option{WithLimiterCost("default", UnitRequests, one), WithLimiterCost("default", UnitContentBytes, one)}},
		{"nil limiter cost", lim, []Option{WithLimiterCost("default", UnitRequests, nil)}},
		{"empty unit", lim, []Option{WithLimiterCost("default", "", one)}},
		{"upper-case unit", lim, []Option{WithLimiterCost("default", "Bytes", one)}},
		{"unit with a quote", lim, []Option{WithLimiterCost("default", `a"b`, one)}},
		{"long unit", lim, []Option{WithLimiterCost("default", strings.Repeat("u", 33), one)}},
		{"partition key for no limiter", lim, []Option{WithPartitionKey("user", testSecret)}},
		{"two partition keys for one", lim, []Option{WithPartitionKey("default", testSecret), WithPartitionKey("default", testSecret)}},
		{"short partition secret", lim, []Option{WithPartitionKey("default", testSecret[:15])}},
	} {
		m, err := New(tc.lim, tc.opts...)
		if m != nil || !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("%s: New = %v, %v; want nil, an error wrapping ErrInvalidOption", tc.name, m, err)
		}
	}
	if _, err := New(lim, WithName("ip"), WithLimiterCost("ip", "llm-tokens", one), WithPartitionKey("ip", testSecret[:16])); err != nil {
		t.Errorf("New with a limiter cost and a partition key: %v", err)
	}
	if _, err := New(lim, WithTrustedProxies("10.0.0.0/8", "192.0.2.1", "2001:db8::/32", "::ffff:10.0.0.0/104"),
		WithProxyHeader("x-forwarded-for"), WithIPv6Prefix(56)); err != nil {
		t.Errorf("New with good options: %v", err)
	}
}

// TestRefusedRequestGivesBack: a later limiter denies, and an earlier one
// that can settle gets its charge back; one that cannot keeps it. With
// WithFailClosed, a failing limiter's refusal gives back the same way.
func TestRefusedRequestGivesBack(t *testing.T) {
	const ip = "192.0.2.1"
	a := settlingFake{newFake(tierlimit.PerMinute(5), time.Second, time.Minute)}
	plain := newFake(tierlimit.PerMinute(5), time.Second, time.Minute)
	b := newFake(tierlimit.PerMinute(1), 40*time.Second, time.Minute)
	b.used[ip] = 1
	m := mustNew(t, a, WithName("a"), WithLimiter("plain", plain, nil), WithLimiter("b", b, nil))
	for i := range 3 {
		w := serve(m, request(ip+":1"))
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("request %d: got %d, want 429", i, w.Code)
		}
	}
	if got := a.charged(ip); got != 0 {
		t.Errorf("a charged %d after 3 refused requests, want 0 (given back)", got)
	}
	if got := plain.charged(ip); got != 3 {
		t.Errorf("a limiter without Settle charged %d, want 3 (it keeps its charge)", got)
	}

	failing := newFake(tierlimit.PerMinute(1), time.Second, time.Minute)
	failing.err = errors.New("redis: down")
	c := settlingFake{newFake(tierlimit.PerMinute(5), time.Second, time.Minute)}
	closed := mustNew(t, c, WithName("c"), WithLimiter("f", failing, nil),
		WithFailClosed(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })),
		WithErrorFunc(func(*http.Request, error) {}))
	if w := serve(closed, request(ip+":1")); w.Code != http.StatusServiceUnavailable || c.charged(ip) != 0 {
		t.Errorf("fail-closed refusal: got %d, c charged %d; want 503, 0", w.Code, c.charged(ip))
	}
}

// TestDecisionFunc checks that the limiters' decisions are told in order
// up to the first denial, not the peeks after it, with the request's
// context.
func TestDecisionFunc(t *testing.T) {
	type seen struct {
		policy  string
		allowed bool
	}
	var got []seen
	tight := newFake(tierlimit.PerMinute(1), time.Second, time.Minute)
	roomy := newFake(tierlimit.PerMinute(10), time.Second, time.Minute)
	m := mustNew(t, tight, WithLimiter("roomy", roomy, nil), WithDecisionFunc(func(ctx context.Context, policy string, res tierlimit.Result) {
		if ctx == nil {
			t.Error("nil context")
		}
		got = append(got, seen{policy, res.Allowed})
	}))
	serve(m, request("192.0.2.1:1"))
	serve(m, request("192.0.2.1:1"))
	want := []seen{{"default", true}, {"roomy", true}, {"default", false}}
	if !slices.Equal(got, want) {
		t.Errorf("decisions told = %v, want %v", got, want)
	}
}
