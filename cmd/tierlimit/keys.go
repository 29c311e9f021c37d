package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// The Redis key format is internal/store's (docs/operations.md):
//
//	<prefix><alg>:<pos>:{<tag>}:<user key>[<suffix>]
//
// store.KeysOf names a key's Redis keys; the command takes them apart to
// read what is stored under them.

// algorithm is one remote algorithm as it shows in Redis.
type algorithm struct {
	name  string // in keys: "tb", "gcra", ...
	title string
	alg   *store.Algorithm
	cfg   store.Config // the token bucket's has a lease ledger, as hybrid's may
}

var algorithms = []algorithm{
	// With a lease ledger, as the hybrid tier may lease: keysOf then names
	// the ledger too. Its state key is a plain TokenBucket's.
	{"tb", "token bucket (remote.TokenBucket, and the hybrid tier's leases)", store.TokenBucket, store.Config{Hold: time.Second}},
	{"gcra", "GCRA (remote.GCRA)", store.GCRA, store.Config{}},
	{"fw", "fixed window (remote.FixedWindow)", store.FixedWindow, store.Config{}},
	{"aw", "anchored window (remote.AnchoredWindow)", store.AnchoredWindow, store.Config{}},
	{"sl", "sliding log (remote.SlidingLog)", store.SlidingLog, store.Config{}},
	{"sw", "sliding window (remote.SlidingWindow)", store.SlidingWindow, store.Config{}},
}

func algorithmNamed(name string) (algorithm, bool) {
	for _, a := range algorithms {
		if a.name == name {
			return a, true
		}
	}
	return algorithm{}, false
}

// keysOf returns the Redis keys alg, built with limit and prefix, uses for
// key, in script order. An error means a bad prefix, limit or key.
func keysOf(a algorithm, limit tierlimit.Limit, prefix, key string) ([]string, error) {
	cfg := a.cfg
	cfg.Prefix = prefix
	return store.KeysOf(a.alg, limit, cfg, key)
}

// keyName is a Redis key of ours, taken apart.
type keyName struct {
	full   string
	alg    string
	config string // the limit's position: 0 the key's own, 1… the extras
	tag    string
	suffix string // after the user key: "", or for the sliding log ":z" or ":h"
	refund string // the ID of a token bucket's refund marker, which names no user key
}

// parseKeyName takes apart full, a key of prefix for user key key, or one
// of the key's refund markers (<prefix>tb:<pos>:{<tag>}!<id>); ok is
// false when full is neither.
func parseKeyName(full, prefix, key string) (keyName, bool) {
	rest, ok := strings.CutPrefix(full, prefix)
	if !ok {
		return keyName{}, false
	}
	alg, rest, ok1 := strings.Cut(rest, ":")
	config, rest, ok2 := strings.Cut(rest, ":{")
	tag, rest, ok3 := strings.Cut(rest, "}")
	if !ok1 || !ok2 || !ok3 {
		return keyName{}, false
	}
	k := keyName{full: full, alg: alg, config: config, tag: tag}
	switch {
	case rest == ":"+key:
		return k, true
	case alg == "sl" && (rest == ":"+key+":z" || rest == ":"+key+":h"):
		k.suffix = rest[len(key)+1:]
		return k, true
	case alg == "tb" && strings.HasPrefix(rest, "!"):
		k.refund = rest[len("!"):]
		return k, true
	}
	return keyName{}, false
}

// tagOf returns the hash tag of key: what is between the braces of its
// Redis keys.
func tagOf(prefix, key string) (string, error) {
	keys, err := keysOf(algorithms[0], tierlimit.PerSecond(1), prefix, key)
	if err != nil {
		return "", err
	}
	k, ok := parseKeyName(keys[0], prefix, key)
	if !ok {
		return "", fmt.Errorf("remote key %q does not follow the documented format", keys[0])
	}
	return k.tag, nil
}

// globEscape escapes the characters Redis's MATCH patterns treat as special.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
