package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The -json schema: every field, by object. Changing one is a new schema.
var benchJSONKeys = map[string][]string{
	"report": {"concurrency", "duration_s", "instances", "keys", "limit", "redis", "results", "schema", "zipf"},
	"limit":  {"burst", "period_us", "rate"},
	"result": {"admitted", "allowed", "decisions", "decisions_per_s", "elapsed_s", "errors", "first_error",
		"p50_ns", "p99_ns", "redis_calls", "redis_calls_per_1000", "strategy"},
}

func keysOfObject(t *testing.T, v any) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v is not a JSON object", v)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestBenchJSON(t *testing.T) {
	args := []string{"bench", "-json", "-duration", "300ms", "-keys", "50", "-zipf", "1.2", "-instances", "2",
		"-concurrency", "2", "-rate", "500", "-period", "2s", "-burst", "100"}
	code, stdout, stderr := runCmd(t, args...)
	if code != exitOK {
		t.Fatalf("run(%q) = %d, stderr %q", args, code, stderr)
	}

	// The exact set of fields, so that no rename goes unnoticed.
	var raw map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout)
	}
	if got := keysOfObject(t, raw); !slices.Equal(got, benchJSONKeys["report"]) {
		t.Errorf("report fields = %q, want %q", got, benchJSONKeys["report"])
	}
	if got := keysOfObject(t, raw["limit"]); !slices.Equal(got, benchJSONKeys["limit"]) {
		t.Errorf("limit fields = %q, want %q", got, benchJSONKeys["limit"])
	}
	results, _ := raw["results"].([]any)
	for _, r := range results {
		if got := keysOfObject(t, r); !slices.Equal(got, benchJSONKeys["result"]) {
			t.Errorf("result fields = %q, want %q", got, benchJSONKeys["result"])
		}
	}

	// The values.
	var r benchReport
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatal(err)
	}
	wantHead := benchReport{Schema: "tierlimit.bench/v1", Redis: "embedded", Limit: benchLimit{Rate: 500, PeriodUS: 2e6, Burst: 100},
		Keys: 50, Zipf: 1.2, Instances: 2, Concurrency: 2, DurationS: 0.3}
	gotHead := r
	gotHead.Results = nil
	if !reflect.DeepEqual(gotHead, wantHead) {
		t.Errorf("report = %+v, want %+v", gotHead, wantHead)
	}
	var names []string
	for _, res := range r.Results {
		names = append(names, res.Strategy)
	}
	if !slices.Equal(names, allStrategies) {
		t.Fatalf("strategies = %q, want %q", names, allStrategies)
	}
	for _, res := range r.Results {
		if res.Decisions <= 0 || res.ElapsedS < 0.3 || res.DecisionsPerS <= 0 || res.P50NS <= 0 || res.P99NS < res.P50NS {
			t.Errorf("%s: %+v: want decisions, elapsed >= 0.3 s and 0 < p50 <= p99", res.Strategy, res)
		}
		if res.Admitted > res.Decisions || res.Allowed <= 0 {
			t.Errorf("%s: admitted %d of %d decisions, allowed %d", res.Strategy, res.Admitted, res.Decisions, res.Allowed)
		}
		if (res.Strategy == stratLocal) != (res.RedisCalls == 0) {
			t.Errorf("%s: %d Redis calls", res.Strategy, res.RedisCalls)
		}
		// A loaded machine can hold the embedded Redis back past the
		// clients' timeouts: the remote limiters then report a few
		// errors; the others never do.
		if exact := res.Strategy == stratTB || res.Strategy == stratGCRA; (!exact && res.Errors != 0) || res.Errors*100 > res.Decisions {
			t.Errorf("%s: %d errors (%s) for %d decisions on a healthy Redis", res.Strategy, res.Errors, res.FirstError, res.Decisions)
		}
		// The exact strategies admit no more than the bound.
		if res.Strategy == stratTB || res.Strategy == stratGCRA {
			if res.Admitted > res.Allowed || res.RedisCalls < res.Decisions {
				t.Errorf("%s: admitted %d > allowed %d, or %d calls for %d decisions", res.Strategy, res.Admitted, res.Allowed,
					res.RedisCalls, res.Decisions)
			}
		}
	}
}

func TestBenchTable(t *testing.T) {
	args := []string{"bench", "-duration", "100ms", "-strategies", "hybrid,local", "-instances", "1", "-concurrency", "1"}
	code, stdout, stderr := runCmd(t, args...)
	if code != exitOK {
		t.Fatalf("run(%q) = %d, stderr %q", args, code, stderr)
	}
	rows := tableRows(stdout, "strategy")
	if len(rows) != 2 || rows[0][0] != "hybrid" || rows[1][0] != "local" {
		t.Errorf("rows = %q, want hybrid then local:\n%s", rows, stdout)
	}
	// Without a terminal, progress is one line per strategy.
	if n := strings.Count(stderr, "\n"); n != 2 || !strings.Contains(stderr, "2/2: local") {
		t.Errorf("stderr = %q, want 2 progress lines", stderr)
	}
}

// tableRows returns the cells of the table whose header starts with
// header, up to its first line that is not a row.
func tableRows(out, header string) [][]string {
	var rows [][]string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, header+" "):
			in = true
		case in && (line == "" || strings.HasPrefix(line, "- ")):
			return rows
		case in:
			rows = append(rows, strings.Fields(line))
		}
	}
	return rows
}

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		capacity, rate  int64
		period, elapsed time.Duration
		demand          []uint64
		want            int64
	}{
		{10, 10, time.Second, 0, []uint64{100}, 10},
		{10, 10, time.Second, 2 * time.Second, []uint64{100, 5, 30}, 30 + 5 + 30},
		{100, 60, time.Minute, 30 * time.Second, []uint64{1000}, 130},
		{5, 1, time.Second, time.Second, nil, 0},
	} {
		if got := allowed(tc.capacity, tc.rate, tc.period, tc.elapsed, tc.demand); got != tc.want {
			t.Errorf("allowed(%d, %d, %v, %v, %v) = %d, want %d", tc.capacity, tc.rate, tc.period, tc.elapsed, tc.demand, got, tc.want)
		}
	}
}

func TestKeySpaceSkew(t *testing.T) {
	for _, tc := range []struct {
		zipf    float64
		hotMore bool // key 0 drawn far more than key 50
	}{{0, false}, {1.5, true}} {
		ks := newKeySpace("t", 100, tc.zipf)
		p := ks.picker(1)
		var n [100]int
		for range 100_000 {
			n[p.next()]++
		}
		if got := n[0] > 10*max(n[50], 1); got != tc.hotMore {
			t.Errorf("zipf %v: key 0 drawn %d times, key 50 %d: hot = %v, want %v", tc.zipf, n[0], n[50], got, tc.hotMore)
		}
		if tc.zipf == 0 && (n[0] < 700 || n[99] < 700) {
			t.Errorf("uniform: keys 0 and 99 drawn %d and %d times of 100000, want about 1000", n[0], n[99])
		}
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{count(0), "0"}, {count(999), "999"}, {count(1000), "1,000"}, {count(-1234567), "-1,234,567"},
		{latency(850), "850ns"}, {latency(1250 * time.Nanosecond), "1.2µs"}, {latency(45 * time.Microsecond), "45µs"},
		{latency(3100 * time.Microsecond), "3.1ms"}, {latency(25 * time.Millisecond), "25ms"},
		{perThousand(1000.4), "1000"}, {perThousand(12.34), "12.3"}, {perThousand(0.0153), "0.0153"}, {perThousand(0), "0"},
		{percent(1, 3), "33.3%"}, {percent(1, 0), "-"},
		{oneLine("a\n  b\tc"), "a b c"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	var b bytes.Buffer
	tb := table{}
	tb.add("name", "n")
	tb.add("a-long-name", "1,000")
	if err := tb.write(&b); err != nil {
		t.Fatal(err)
	}
	if want := "name             n\na-long-name  1,000\n"; b.String() != want {
		t.Errorf("table =\n%q, want\n%q", b.String(), want)
	}
}
