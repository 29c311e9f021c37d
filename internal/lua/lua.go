// Package lua holds the Redis scripts of tierlimit, one .lua file each,
// embedded and wrapped once in a *redis.Script (run with Script.Run: EVALSHA,
// then EVAL on NOSCRIPT). It is internal: the scripts' KEYS, ARGV and
// replies are a protocol between tierlimit's own packages (internal/store
// speaks it), free to change between releases.
//
// Every script reads its time from the server (TIME) unless ARGV[1] carries
// a client clock, keeps its keys in KEYS and computes in integer
// microseconds. The limiter scripts (ledger.lua aside) decide or settle
// entries, each a user key under one of its limits: ARGV[2] is the mode
// ("0" decides all entries or none, "1" settles each by a signed cost,
// never denied), then each entry's cost and limit, spelled as its state
// records it (a state written under another limit is converted first). They
// reply {allowed, granted, then per entry: remaining, retry_us, reset_us};
// heartbeat.lua replies a count. Each file's header states its KEYS, ARGV
// and invariants.
package lua

import (
	"embed"

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
	// Ledger is the token buckets of a key's limits, each with a ledger of
	// the leases held: the hybrid tier's store.
	Ledger = load("ledger.lua")
	// Heartbeat keeps the set of a hybrid fleet's live instances.
	Heartbeat = load("heartbeat.lua")
	// Mark sets or reads a short-lived mark of a key: hybrid's charge-back
	// marks a bucket it found full.
	Mark = load("mark.lua")
)

// Source returns the full text of the script in file name as it is sent
// to Redis: lib.lua, then the file. Redis defines every helper anew on each
// call, those a script leaves unused included; they cost too little to be
// worth leaving out (bench/RESULTS.md, "One path per script").
func Source(name string) (string, error) {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		return "", err
	}
	body, err := files.ReadFile(name)
	if err != nil {
		return "", err
	}
	return string(lib) + "\n" + string(body), nil
}

func load(name string) *redis.Script {
	src, err := Source(name)
	if err != nil {
		// The files are embedded at build time: a missing one is a build bug.
		panic("lua: " + err.Error())
	}
	return redis.NewScript(src)
}
