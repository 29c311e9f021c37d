package httplimit

import (
	"fmt"
	"github.com/tierlimit/tierlimit/internal/clientip"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestClientIPAllocs checks what a key costs: one allocation, its text,
// wherever the client was found.
func TestClientIPAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	trusted := WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48")
	fwd := WithProxyHeader("forwarded")
	for _, tc := range []struct {
		name   string
		opts   []Option
		remote string
		header []string
		key    string
	}{
		{"IPv4 peer", nil, "192.0.2.1:50000", nil, "192.0.2.1"},
		{"IPv6 peer", nil, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::"},
		{"IPv4 peer, proxies trusted", []Option{trusted}, "192.0.2.1:50000", nil, "192.0.2.1"},
		{"XFF IPv4 client", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7"},
		{"XFF IPv6 client", []Option{trusted}, "[2001:db8:ffff::1]:50000",
			[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, [2001:db8:ffff::2]:443"}, "2001:db8:1:2::"},
		{"Forwarded IPv4 client", []Option{trusted, fwd}, "10.0.0.1:50000",
			[]string{"Forwarded", "for=198.51.100.7;proto=https, for=10.0.0.2"}, "198.51.100.7"},
		{"Forwarded IPv6 client", []Option{trusted, fwd}, "[2001:db8:ffff::1]:50000",
			[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2::"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, tc.opts...).ip
			r := request(tc.remote, tc.header...)
			if key, ok := rs.clientIP(r); key != tc.key || !ok {
				t.Fatalf("clientIP = %q, %v; want %q, true", key, ok, tc.key)
			}
			if got := testing.AllocsPerRun(100, func() { rs.clientIP(r) }); got != 1 {
				t.Errorf("clientIP allocates %v times per request, want 1", got)
			}
		})
	}
}

// The client and its proxies in TestSpoofedBehindProxy: the client's first
// proxy appends the client's address to what the client sent.
const (
	spoofClient = "203.0.113.5"
	spoofPeer   = "10.0.0.1:443"
	spoofHop    = "10.0.0.9" // a second trusted proxy, between the first and the peer
)

// TestSpoofedBehindProxy sends, behind trusted proxies that append the
// client's address to its proxy header, requests whose client wrote that
// header first: addresses, malformed elements, long lines, several lines.
// Whatever it wrote, the client must be keyed by the address its proxy
// appended, held to its own quota, and never charged to the proxy's key.
func TestSpoofedBehindProxy(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	for _, tc := range []struct {
		header string
		client []string // the field lines the client sent
	}{
		{HeaderForwarded, []string{`for="x`}},
		{HeaderForwarded, []string{`for="[2001:db8::1`}},
		{HeaderForwarded, []string{`for="198.51.100.1\`}},
		{HeaderForwarded, []string{`for=198.51.100.1;proto="https`}},
		{HeaderForwarded, []string{`"`}},
		{HeaderForwarded, []string{`for=198.51.100.1;;==;garbage`}},
		{HeaderForwarded, []string{`for=198.51.100.1;for=198.51.100.2`}},
		{HeaderForwarded, []string{`by=198.51.100.1`}},
		{HeaderForwarded, []string{`for=[2001:db8::1]`}},
		{HeaderForwarded, []string{`for=999.1.1.1`}},
		{HeaderForwarded, []string{`for=unknown`}},
		{HeaderForwarded, []string{`for=_hidden`}},
		{HeaderForwarded, []string{"for=\x00"}},
		{HeaderForwarded, []string{`for=10.0.0.5`}},
		{HeaderForwarded, []string{strings.Repeat("for=10.0.0.5, ", 100)}},
		{HeaderForwarded, []string{`for="x`, `for=unknown`}},
		{HeaderForwarded, []string{`for=198.51.100.1`, `for="x`}},
		{HeaderForwarded, []string{`for="` + huge}},
		{HeaderForwarded, []string{strings.Repeat("for=198.51.100.1, ", 1<<16)}},
		{HeaderXForwardedFor, []string{`garbage`}},
		{HeaderXForwardedFor, []string{`"198.51.100.1`}},
		{HeaderXForwardedFor, []string{`[2001:db8::1`}},
		{HeaderXForwardedFor, []string{`198.51.100.1:99999`}},
		{HeaderXForwardedFor, []string{`999.1.1.1`}},
		{HeaderXForwardedFor, []string{`unknown`}},
		{HeaderXForwardedFor, []string{`10.0.0.5`}},
		{HeaderXForwardedFor, []string{`garbage`, `198.51.100.1, unknown`}},
		{HeaderXForwardedFor, []string{huge}},
		{HeaderXForwardedFor, []string{strings.Repeat("10.0.0.5, ", 1<<16)}},
	} {
		short := strings.Join(tc.client, "\\n")
		if len(short) > 40 {
			short = short[:40] + "…"
		}
		for _, proxy := range []struct {
			name  string
			lines func(client []string) []string
		}{
			{"appends", func(c []string) []string { return appendHop(tc.header, c, spoofClient) }},
			{"adds a line", func(c []string) []string { return append(c, hopElem(tc.header, spoofClient)) }},
			{"then another appends", func(c []string) []string {
				return appendHop(tc.header, appendHop(tc.header, c, spoofClient), spoofHop)
			}},
		} {
			t.Run(fmt.Sprintf("%s/%q/proxy %s", tc.header, short, proxy.name), func(t *testing.T) {
				lim := newFake(tierlimit.PerMinute(3), time.Second, time.Minute)
				m := mustNew(t, lim, WithTrustedProxies("10.0.0.0/8"), WithProxyHeader(tc.header))
				for i := range 5 {
					r := request(spoofPeer)
					r.Header[tc.header] = proxy.lines(clone(tc.client))
					want := http.StatusOK
					if i >= 3 {
						want = http.StatusTooManyRequests
					}
					if w := serve(m, r); w.Code != want {
						t.Errorf("request %d: %d, want %d", i, w.Code, want)
					}
				}
				// Another client behind the same proxy has its whole quota.
				r := request(spoofPeer, tc.header, hopElem(tc.header, "198.51.100.200"))
				if w := serve(m, r); w.Code != http.StatusOK {
					t.Errorf("another client: %d, want 200", w.Code)
				}
				for _, c := range lim.asked() {
					if c.key != spoofClient && c.key != "198.51.100.200" {
						t.Fatalf("limiter asked %v, want the client's key %q", c, spoofClient)
					}
				}
			})
		}
	}
}

// hopElem is the element a proxy writes for the address it received from.
func hopElem(header, addr string) string {
	if header == HeaderForwarded {
		return "for=" + addr
	}
	return addr
}

// appendHop appends the element of addr to the last of lines, as a proxy
// does, or adds it as a line if there is none.
func appendHop(header string, lines []string, addr string) []string {
	if len(lines) == 0 {
		return []string{hopElem(header, addr)}
	}
	lines[len(lines)-1] += ", " + hopElem(header, addr)
	return lines
}

func clone(lines []string) []string { return append([]string(nil), lines...) }

// TestWalkBounds checks where the walk of a proxy header stops: after
// clientip.MaxElems elements, or clientip.MaxHeaderBytes from the right end of the header,
// keying the request as its peer; within them, the client is found.
func TestWalkBounds(t *testing.T) {
	const peer = "10.1.2.3"
	hops := func(n int) string { return strings.TrimSuffix(strings.Repeat("10.0.0.5, ", n), ", ") }
	// pad is n bytes: spaces, then a trusted proxy.
	pad := func(n int) string { return strings.Repeat(" ", n-len(", 10.0.0.5")) + ", 10.0.0.5" }
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"client behind clientip.MaxElems-1 trusted hops", []string{"198.51.100.1, " + hops(clientip.MaxElems-1)}, "198.51.100.1"},
		{"client behind clientip.MaxElems trusted hops", []string{"198.51.100.1, " + hops(clientip.MaxElems)}, peer},
		{"clientip.MaxElems trusted hops: the left-most", []string{"10.0.0.4, " + hops(clientip.MaxElems-1)}, "10.0.0.4"},
		{"clientip.MaxElems+1 trusted hops", []string{hops(clientip.MaxElems + 1)}, peer},
		{"hops over several lines", []string{"198.51.100.1", hops(clientip.MaxElems / 2), hops(clientip.MaxElems / 2)}, peer},
		{"an empty element counts", []string{"198.51.100.1,," + hops(clientip.MaxElems-2)}, "198.51.100.1"},
		{"empty elements count", []string{"198.51.100.1,,," + hops(clientip.MaxElems-2)}, peer},
		{"an empty line counts", []string{"198.51.100.1", "", hops(clientip.MaxElems - 1)}, peer},
		{"client within clientip.MaxHeaderBytes", []string{"198.51.100.1," + pad(clientip.MaxHeaderBytes-len("198.51.100.1,"))}, "198.51.100.1"},
		// The walk reads "98.51.100.1": an address, but not the element.
		{"client cut by clientip.MaxHeaderBytes", []string{"198.51.100.1," + pad(clientip.MaxHeaderBytes-len("98.51.100.1,"))}, peer},
		{"client past clientip.MaxHeaderBytes", []string{"198.51.100.1," + strings.Repeat(" ", clientip.MaxHeaderBytes) + "10.0.0.5"}, peer},
		{"bytes over several lines", []string{"198.51.100.1", strings.Repeat(" ", clientip.MaxHeaderBytes/2), strings.Repeat(" ", clientip.MaxHeaderBytes/2)}, peer},
		{"empty lines count", append([]string{"198.51.100.1"}, make([]string, clientip.MaxHeaderBytes)...), peer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, WithTrustedProxies("10.0.0.0/8")).ip
			r := request(peer + ":80")
			r.Header[HeaderXForwardedFor] = tc.lines
			if key, _ := rs.clientIP(r); key != tc.want {
				t.Errorf("clientIP = %q, want %q", key, tc.want)
			}
		})
	}
}

// longHeaders are proxy headers of 1 MiB from a trusted peer (10.0.0.1):
// what a client wrote, then the element its proxy appended; or elements
// of trusted proxies, or empty ones, all the way.
func longHeaders() []struct {
	name, header, line, key string
} {
	const size = 1 << 20
	fill := func(elem string) string { return strings.Repeat(elem, size/len(elem)) }
	return []struct{ name, header, line, key string }{
		{"xff/spoofed", HeaderXForwardedFor, fill("198.51.100.1, ") + "203.0.113.5", "203.0.113.5"},
		{"xff/garbage", HeaderXForwardedFor, fill("x") + ", 203.0.113.5", "203.0.113.5"},
		{"xff/trusted", HeaderXForwardedFor, fill("10.0.0.5, ") + "10.0.0.5", "10.0.0.1"},
		{"xff/empty", HeaderXForwardedFor, fill(" ,") + "10.0.0.5", "10.0.0.1"},
		{"forwarded/spoofed", HeaderForwarded, fill("for=198.51.100.1, ") + "for=203.0.113.5", "203.0.113.5"},
		{"forwarded/garbage", HeaderForwarded, `for="` + fill("x") + ", for=203.0.113.5", "203.0.113.5"},
		{"forwarded/trusted", HeaderForwarded, fill(`for="[::ffff:10.0.0.5]";proto=https, `) + "for=10.0.0.5", "10.0.0.1"},
		{"forwarded/empty", HeaderForwarded, fill(";, ") + "for=10.0.0.5", "10.0.0.1"},
	}
}

// TestLongHeaderBounded checks that a 1 MiB proxy header costs what a short
// one does: the key's allocation, and bytes of the order of the key.
func TestLongHeaderBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	for _, tc := range longHeaders() {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, WithTrustedProxies("10.0.0.0/8"), WithProxyHeader(tc.header)).ip
			r := request("10.0.0.1:443")
			r.Header[tc.header] = []string{tc.line}
			if key, _ := rs.clientIP(r); key != tc.key {
				t.Fatalf("clientIP = %q, want %q", key, tc.key)
			}
			if got := testing.AllocsPerRun(100, func() { rs.clientIP(r) }); got > 1 {
				t.Errorf("clientIP allocates %v times per request, want at most 1", got)
			}
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			const runs = 100
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range runs {
				rs.clientIP(r)
			}
			runtime.ReadMemStats(&after)
			if got := (after.TotalAlloc - before.TotalAlloc) / runs; got > 64 {
				t.Errorf("clientIP allocates %d bytes per request, want at most 64", got)
			}
		})
	}
}
