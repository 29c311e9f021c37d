package httplimit

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/tierlimit/tierlimit"
)

// FuzzFields sets the fields of two limiters, of two units, the second
// with partition keys, from any Results, and checks that they parse as
// the draft's structured fields, that every item names a quota of its
// limiter, and that Retry-After is never before the denying item's t.
func FuzzFields(f *testing.F) {
	f.Add(int64(100), int64(60_000_000), int64(0), int64(42), int64(0), int64(30_000_000), true, int64(9), false)
	f.Add(int64(3), int64(1_500_000), int64(50), int64(-5), int64(2_000_000), int64(99_000_000), false, int64(1<<40), true)
	f.Add(int64(1<<50), int64(1), int64(1<<55), int64(1<<62), int64(-1), int64(1<<62), false, int64(-1), false)
	f.Fuzz(func(t *testing.T, rate, periodMicros, burst, remaining, retryMicros, resetMicros int64, allowed bool, remaining2 int64, never bool) {
		l := tierlimit.Limit{Rate: rate, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
		res := tierlimit.Result{Allowed: allowed, Limit: l, Remaining: remaining,
			RetryAfter: time.Duration(retryMicros) * time.Microsecond, ResetAfter: time.Duration(resetMicros) * time.Microsecond}
		reqs := &rule{name: "req\"s", prefix: `"req\"s`, unit: UnitRequests}
		bytes := &rule{name: "bytes", prefix: `"bytes`, unit: UnitContentBytes, pk: newPartitioner(testSecret)}
		outs := []outcome{{rule: reqs, res: res}, {rule: bytes, res: tierlimit.Result{Allowed: true, Limit: tierlimit.PerSecond(1000), Remaining: remaining2}, never: never}}
		bytes.pk.partitionKey(&outs[1].pk, "192.0.2.1")
		h := http.Header{}
		setHeaders(h, outs, !allowed || never, true)

		for _, field := range []string{hPolicy, hRateLimit} {
			if h[field] == nil {
				continue
			}
			list, err := httpsfv.UnmarshalList(h[field])
			if err != nil {
				t.Fatalf("%s: %q: %v", field, h[field], err)
			}
			for _, member := range list {
				it := member.(httpsfv.Item)
				name, _ := it.Value.(string)
				if !strings.HasPrefix(name, `req"s`) && !strings.HasPrefix(name, "bytes") {
					t.Errorf("%s: item %q names no limiter", field, name)
				}
				for _, k := range it.Params.Names() {
					v, _ := it.Params.Get(k)
					switch v.(type) {
					case int64, string, []byte:
					default:
						t.Errorf("%s: %s=%#v", field, k, v)
					}
				}
			}
		}
		if w := effectiveWindow(res); !allowed && w > res.RetryAfter {
			t.Errorf("t = %v after RetryAfter %v", w, res.RetryAfter)
		}
	})
}
