// Package lua holds the Redis scripts of tierlimit, one .lua file each,
// embedded and wrapped once in a *redis.Script (run with Script.Run: EVALSHA,
// then EVAL on NOSCRIPT).
//
// Every script reads its time from the server (TIME) unless ARGV[1] carries
// a client clock, keeps its keys in KEYS and computes in integer
// microseconds. The limiter scripts reply {allowed, granted, then per limit:
// remaining, retry_us, reset_us}; heartbeat.lua replies a count. Each file's
// header states its KEYS, ARGV and invariants.
package lua

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// The scripts. Each is lib.lua followed by the file of its name.
var (
	TokenBucket    = load("tokenbucket.lua")
	GCRA           = load("gcra.lua")
	FixedWindow    = load("fixedwindow.lua")
	AnchoredWindow = load("anchoredwindow.lua")
	SlidingLog     = load("slidinglog.lua")
	SlidingWindow  = load("slidingwindow.lua")
	// Ledger is the token bucket with a ledger of leases held: the hybrid
	// tier's store with hybrid.WithLeaseLedger.
	Ledger = load("ledger.lua")
	// Heartbeat keeps the set of a hybrid fleet's live instances.
	Heartbeat = load("heartbeat.lua")
)

// Source returns the full text of the script in file name as it is sent
// to Redis: the helpers of lib.lua that it uses (directly or through another
// helper), then the file. Redis runs the whole text on every call, and each
// helper is a closure made anew each time: leaving out the unused ones
// saves about a microsecond of server time per call.
func Source(name string) (string, error) {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		return "", err
	}
	body, err := files.ReadFile(name)
	if err != nil {
		return "", err
	}
	return string(helpers(string(lib), string(body))) + string(body), nil
}

// helper is one function of lib.lua: its name and its text, comments
// included.
type helper struct {
	name, text string
}

// splitLib cuts lib.lua into its helpers, in order: the paragraphs that
// define a function, each with its comment (the file's header is dropped).
func splitLib(lib string) []helper {
	var hs []helper
	for _, c := range strings.Split(lib, "\n\n") {
		if _, after, ok := strings.Cut(c, "local function "); ok {
			name, _, _ := strings.Cut(after, "(")
			hs = append(hs, helper{name: name, text: c + "\n\n"})
		}
	}
	return hs
}

// helpers returns the helpers of lib that body uses, in lib's order (which
// defines each helper before the helpers that call it).
func helpers(lib, body string) []byte {
	hs := splitLib(lib)
	used := make([]bool, len(hs))
	// Walk back from the last helper: one that is used marks those it
	// calls, which come before it.
	for i := len(hs) - 1; i >= 0; i-- {
		if calls(body, hs[i].name) {
			used[i] = true
		}
		for j := i + 1; j < len(hs) && !used[i]; j++ {
			if used[j] && calls(hs[j].text, hs[i].name) {
				used[i] = true
			}
		}
	}
	var out []byte
	for i, h := range hs {
		if used[i] {
			out = append(out, h.text...)
		}
	}
	return out
}

// calls reports whether text calls the function name.
func calls(text, name string) bool {
	for rest := text; ; {
		i := strings.Index(rest, name+"(")
		if i < 0 {
			return false
		}
		// Not a longer name ending in name, nor its own definition.
		prev := byte(' ')
		if i > 0 {
			prev = rest[i-1]
		}
		if !(prev == '_' || prev >= 'a' && prev <= 'z' || prev >= 'A' && prev <= 'Z' || prev >= '0' && prev <= '9') &&
			!strings.HasSuffix(rest[:i], "local function ") {
			return true
		}
		rest = rest[i+len(name):]
	}
}

func load(name string) *redis.Script {
	src, err := Source(name)
	if err != nil {
		// The files are embedded at build time: a missing one is a build bug.
		panic("lua: " + err.Error())
	}
	return redis.NewScript(src)
}
