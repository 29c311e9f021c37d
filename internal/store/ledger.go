package store

import (
	"fmt"
	"strconv"
	"strings"
)

// Record is one holder's record in a token bucket's lease ledger
// (ledger.lua).
type Record struct {
	Holder   string
	Held     int64 // tokens the holder may still spend, at most
	Gen      int64 // the number of its last claim
	Deadline int64 // µs of the server clock after which it spends none
	Grant    int64 // what its last claim handed out
}

// SplitLedger splits the value of a token bucket's key into the bucket's
// state, "k:r:ts:unit:per:cap", and the records of its lease ledger that
// follow it, each ";holder:held:gen:deadline:grant" (none for a bucket
// without a ledger).
func SplitLedger(v string) (state string, records []Record, err error) {
	state, rest, _ := strings.Cut(v, ";")
	if rest == "" {
		return state, nil, nil
	}
	for _, s := range strings.Split(rest, ";") {
		f := strings.Split(s, ":")
		if len(f) != 5 || f[0] == "" {
			return state, records, fmt.Errorf("ledger record %q: want holder:held:gen:deadline:grant", s)
		}
		rec := Record{Holder: f[0]}
		for i, p := range []*int64{&rec.Held, &rec.Gen, &rec.Deadline, &rec.Grant} {
			if *p, err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
				return state, records, fmt.Errorf("ledger record %q: %w", s, err)
			}
		}
		records = append(records, rec)
	}
	return state, records, nil
}
