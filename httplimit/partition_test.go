package httplimit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// TestPartitionKey checks the pk parameter: on both fields of the
// limiters that have it, the HMAC of the key and never the key, one per
// key.
func TestPartitionKey(t *testing.T) {
	mac := func(secret []byte, key string) []byte {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte(key))
		return h.Sum(nil)[:pkLen]
	}
	ip := newFake(tierlimit.PerMinute(10), time.Second, time.Minute)
	user := newFake(tierlimit.PerHour(5), time.Second, time.Hour) // tighter than ip: RateLimit reports it
	m := mustNew(t, ip, WithName("ip"),
		WithLimiter("user", user, KeyHeader("X-API-Key")),
		WithPartitionKey("user", testSecret))
	pks := map[string]string{}
	for _, key := range []string{"sk_live_alice", "sk_live_bob", "sk_live_alice"} {
		w := serve(m, request("192.0.2.1:1", "X-API-Key", key))
		for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
			items := parseField(t, w.Header(), field)
			if _, has := items[0].params["pk"]; has && field == "RateLimit-Policy" {
				t.Errorf("%s: ip item %v has a pk, want none (no WithPartitionKey)", field, items[0])
			}
			got, _ := items[len(items)-1].params["pk"].([]byte)
			if want := mac(testSecret, key); !bytes.Equal(got, want) {
				t.Errorf("%s for key %q: pk %x, want HMAC-SHA256 %x", field, key, got, want)
			}
			if prev, seen := pks[key]; seen && prev != string(got) {
				t.Errorf("%s for key %q: pk %x, then %x: want one pk per key", field, key, prev, got)
			}
			pks[key] = string(got)
		}
		for name, vals := range w.Header() {
			if v := strings.Join(vals, ", "); strings.Contains(v, key) || strings.Contains(v, "192.0.2.1") {
				t.Errorf("%s: %q holds the raw key", name, v)
			}
		}
	}
	if pks["sk_live_alice"] == pks["sk_live_bob"] {
		t.Errorf("two keys share pk %x", pks["sk_live_alice"])
	}

	// Another secret, other pks: nobody without it can compute one.
	other := mustNew(t, user, WithName("user"), WithKey(KeyHeader("X-API-Key")), WithPartitionKey("user", bytes.Repeat([]byte{7}, 16)))
	w := serve(other, request("192.0.2.1:1", "X-API-Key", "sk_live_alice"))
	if got := parseField(t, w.Header(), "RateLimit")[0].params["pk"].([]byte); string(got) == pks["sk_live_alice"] {
		t.Errorf("two secrets give one pk %x", got)
	}
}

// TestPartitionKeyConcurrent computes partition keys from many goroutines
// (its pooled HMACs must not mix), for the race detector.
func TestPartitionKeyConcurrent(t *testing.T) {
	p := newPartitioner(testSecret)
	done := make(chan bool)
	for g := range 8 {
		go func() {
			defer func() { done <- true }()
			key := strings.Repeat("k", g+1)
			want := hmac.New(sha256.New, testSecret)
			want.Write([]byte(key))
			for range 200 {
				var got [pkLen]byte
				p.partitionKey(&got, key)
				if !bytes.Equal(got[:], want.Sum(nil)[:pkLen]) {
					t.Errorf("partitionKey(%q) = %x, want %x", key, got, want.Sum(nil)[:pkLen])
					return
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
}

// TestPartitionKeyShared: limiters of one key and one secret show one pk
// (computed once), limiters of different keys different ones.
func TestPartitionKeyShared(t *testing.T) {
	newLim := func() *fakeLimiter { return newFake(tierlimit.PerMinute(10), time.Second, time.Minute) }
	m := mustNew(t, newLim(), WithName("a"),
		WithLimiter("b", newLim(), KeyHeader("X-API-Key")),
		WithLimiter("c", newLim(), nil),
		WithPartitionKey("a", testSecret), WithPartitionKey("b", testSecret), WithPartitionKey("c", testSecret))
	w := serve(m, request("192.0.2.1:1", "X-API-Key", "k1"))
	pk := map[string]string{}
	for _, it := range parseField(t, w.Header(), "RateLimit-Policy") {
		pk[strings.SplitN(it.name, ":", 2)[0]] = string(it.params["pk"].([]byte))
	}
	if pk["a"] != pk["c"] || pk["a"] == pk["b"] || len(pk["a"]) != pkLen {
		t.Errorf("pks a %x, b %x, c %x; want a == c (one key), b another, %d bytes", pk["a"], pk["b"], pk["c"], pkLen)
	}
}
