// Package script compiles tierlimit's Lua scripts (package lua, one .lua
// file each) into go-redis Scripts, run with Script.Run: EVALSHA, then EVAL
// on NOSCRIPT. It is internal: the scripts' KEYS, ARGV and replies are a
// protocol between tierlimit's own packages (internal/store speaks it),
// free to change between releases.
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
package script

import (
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/lua"
)

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
	// Permits holds the permits of one key of a concurrency limiter.
	Permits = load("permits.lua")
)

func load(name string) *redis.Script {
	src, err := lua.Source(name)
	if err != nil {
		// The files are embedded at build time: a missing one is a build bug.
		panic("script: " + err.Error())
	}
	return redis.NewScript(src)
}
