package store

import (
	"fmt"
	"strconv"
	"strings"
)

// Ledger is a token bucket's lease ledger as Redis holds it (ledger.lua).
type Ledger struct {
	Total int64 // the records' held, summed
	// Lo is at most every record's deadline and Hi at least: until Lo
	// passes, a call reads only its holder's record.
	Lo, Hi  int64
	Records []Record
}

// Record is one holder's record in a lease ledger.
type Record struct {
	Holder string
	// Held is the tokens the holder may still spend, at most, plus those
	// handed to it in replies it never got.
	Held     int64
	Gen      int64 // the number of its last call
	Deadline int64 // µs of the server clock after which it spends none
	Handed   int64 // the total ever handed to the holder in replies
}

// SplitLedger splits the value of a token bucket's key into the bucket's
// state, "k:r:ts:unit:per:cap", and the lease ledger that may follow it,
// "|total:lo:hi" then a record ";holder:held:gen:deadline:handed" per
// holder, none when the last grant's deadline hi has not passed but no
// record is left (the zero Ledger for a bucket without one).
func SplitLedger(v string) (state string, l Ledger, err error) {
	state, rest, ok := strings.Cut(v, "|")
	if !ok {
		return state, l, nil
	}
	head, recs, _ := strings.Cut(rest, ";")
	f, err := ParseInts(head, 3)
	if err != nil {
		return state, l, fmt.Errorf("ledger %q: want total:lo:hi: %w", head, err)
	}
	l.Total, l.Lo, l.Hi = f[0], f[1], f[2]
	if recs == "" {
		// A head alone: no record is left, but a grant's deadline (Hi)
		// has not passed, until which the key lives (Claim.Live).
		if l.Total != 0 {
			return state, l, fmt.Errorf("ledger %q: a total without records", rest)
		}
		return state, l, nil
	}
	for _, s := range strings.Split(recs, ";") {
		holder, nums, _ := strings.Cut(s, ":")
		f, err := ParseInts(nums, 4)
		if holder == "" || err != nil {
			return state, l, fmt.Errorf("ledger record %q: want holder:held:gen:deadline:handed", s)
		}
		l.Records = append(l.Records, Record{Holder: holder, Held: f[0], Gen: f[1], Deadline: f[2], Handed: f[3]})
	}
	return state, l, nil
}

// ParseInts parses n integers spelled "a:b:…", as the scripts' states
// spell them.
func ParseInts(s string, n int) ([]int64, error) {
	parts := strings.Split(s, ":")
	if len(parts) != n {
		return nil, fmt.Errorf("%d fields, want %d", len(parts), n)
	}
	out := make([]int64, n)
	for i, p := range parts {
		x, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = x
	}
	return out, nil
}
