package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/remote"
)

// The Redis key format is remote's (docs/operations.md):
//
//	<prefix><alg>:<config>:{<tag>}:<user key>[<suffix>]
//
// remote keeps the hashes behind <config> and <tag> unexported. Rather
// than copy them, keysOf asks a remote limiter which keys it would use:
// a client hook captures its script call before anything is sent. The
// command then follows the format by construction.

// errCaptured stops a captured command before it reaches the network.
var errCaptured = errors.New("captured")

// captureHook records the KEYS of the script calls it sees and sends
// nothing.
type captureHook struct{ keys []string }

// DialHook passes dials through; none happens, as nothing is sent.
func (h *captureHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook records a script call's KEYS and stops the command.
func (h *captureHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(args) >= 3 {
			n, _ := args[2].(int)
			for _, k := range args[3:min(len(args), 3+n)] {
				if s, ok := k.(string); ok {
					h.keys = append(h.keys, s)
				}
			}
		}
		return errCaptured
	}
}

// ProcessPipelineHook stops a pipeline: keysOf never sends one.
func (h *captureHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { return errCaptured }
}

// algorithm is one remote algorithm as it shows in Redis.
type algorithm struct {
	name  string // in keys: "tb", "gcra", ...
	title string
	build func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (tierlimit.Limiter, error)
}

var algorithms = []algorithm{
	// Built with a lease ledger, as the hybrid tier builds it: keysOf then
	// names the ledger too. Its state key is a plain TokenBucket's.
	{"tb", "token bucket (remote.TokenBucket, and the hybrid tier's leases)", limiterOf(ledgerBucket)},
	{"gcra", "GCRA (remote.GCRA)", limiterOf(remote.NewGCRA)},
	{"fw", "fixed window (remote.FixedWindow)", limiterOf(remote.NewFixedWindow)},
	{"aw", "anchored window (remote.AnchoredWindow)", limiterOf(remote.NewAnchoredWindow)},
	{"sl", "sliding log (remote.SlidingLog)", limiterOf(remote.NewSlidingLog)},
	{"sw", "sliding window (remote.SlidingWindow)", limiterOf(remote.NewSlidingWindow)},
}

// ledgerBucket is remote.NewTokenBucket with a lease ledger.
func ledgerBucket(rdb redis.UniversalClient, l tierlimit.Limit, opts ...remote.Option) (*remote.TokenBucket, error) {
	return remote.NewTokenBucket(rdb, l, append(slices.Clip(opts), remote.WithLeaseLedger(time.Second))...)
}

func limiterOf[L tierlimit.Limiter](newL func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (L, error)) func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (tierlimit.Limiter, error) {
	return func(rdb redis.UniversalClient, l tierlimit.Limit, opts ...remote.Option) (tierlimit.Limiter, error) {
		return newL(rdb, l, opts...)
	}
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
func keysOf(alg algorithm, limit tierlimit.Limit, prefix, key string) ([]string, error) {
	hook := &captureHook{}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"}) // never dialled: the hook answers
	defer rdb.Close()
	rdb.AddHook(hook)
	lim, err := alg.build(rdb, limit, remote.WithPrefix(prefix))
	if err != nil {
		return nil, err
	}
	if _, err := lim.AllowN(context.Background(), key, 0); !errors.Is(err, errCaptured) {
		if err == nil {
			err = errors.New("no script call")
		}
		return nil, err
	}
	if len(hook.keys) == 0 {
		return nil, fmt.Errorf("remote %s: script call without keys", alg.name)
	}
	return hook.keys, nil
}

// keyName is a Redis key of ours, taken apart.
type keyName struct {
	full   string
	alg    string
	config string
	tag    string
	suffix string // after the user key: "", for the sliding log ":z" or ":h", for the token bucket's lease ledger ":held"
	refund string // the ID of a token bucket's refund marker, which names no user key
}

// parseKeyName takes apart full, a key of prefix for user key key, or one
// of the key's refund markers (<prefix>tb:<config>:{<tag>}!<id>); ok is
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
	case alg == "sl" && (rest == ":"+key+":z" || rest == ":"+key+":h"),
		alg == "tb" && rest == ":"+key+":held":
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
