package httplimit

import (
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// memoSlots is the number of addresses a trustMemo holds (1<<memoBits):
// a fleet of proxies in front of a service is this size or smaller.
const (
	memoBits  = 5
	memoSlots = 1 << memoBits
)

// trustMemo remembers the text of IPv6 addresses found to be trusted
// proxies, as they are written in RemoteAddr or a proxy header, so that a
// request from a known proxy is not parsed and matched against every
// trusted prefix again. Each IPv6 peer or hop costs a parse and a prefix
// search of about 40 ns, and a lookup under 10: resolving a client behind
// an IPv6 proxy takes 126 ns rather than 188 with X-Forwarded-For, 170
// rather than 220 with Forwarded (BenchmarkClientIP, medians of 6). An IPv4
// address parses and matches in 20 ns, and memos saved nothing measurable
// behind IPv4 proxies, so the resolver uses them behind an IPv6 peer only.
//
// It is a fixed table indexed by a hash of the text; a text that lands on
// a taken slot replaces it now and then (see add). Only texts that parsed
// as trusted addresses are added, so a client cannot fill it, and a miss
// costs what the lookup saves plus, now and then, a copy of a trusted
// text. A trustMemo is safe for concurrent use.
type trustMemo struct {
	slots [memoSlots]atomic.Pointer[string]
}

func newTrustMemo() *trustMemo { return new(trustMemo) }

// slot returns text's slot: a multiplicative hash of the length and the
// last four bytes of the address, where the addresses of one fleet
// differ; in "[addr]:port" those before the ']'. A general hash of the
// whole text (hash/maphash) made the middleware 40 ns slower behind an
// IPv6 proxy (BenchmarkOverheadPaired). A text chosen to collide can only
// evict a proxy (costing a parse), never be believed.
func (m *trustMemo) slot(text string) *atomic.Pointer[string] {
	end := len(text)
	if end > 0 && text[0] == '[' {
		if i := strings.LastIndexByte(text, ']'); i > 0 {
			end = i
		}
	}
	var h uint32
	for i := max(end-4, 0); i < end; i++ {
		h = h<<8 | uint32(text[i])
	}
	h += uint32(len(text)) << 27
	return &m.slots[(h*0x9e3779b1)>>(32-memoBits)]
}

// has reports whether text was added.
func (m *trustMemo) has(text string) bool {
	p := m.slot(text).Load()
	return p != nil && *p == text
}

// memoReplace is how rarely add replaces a taken slot: once in that many
// tries. An empty slot is always filled.
const memoReplace = 16

// add remembers text, a trusted proxy's address as written, copying it
// out of what may be a large header. A taken slot is replaced once in
// memoReplace tries, chosen at random: behind more proxies than slots (the
// edge addresses of a CDN, say) every request could otherwise evict
// another proxy and pay two allocations for it; this way it pays them on
// one request in memoReplace, and the memo still follows a fleet whose
// addresses change.
func (m *trustMemo) add(text string) {
	p := m.slot(text)
	if p.Load() != nil && rand.Uint32()%memoReplace != 0 {
		return
	}
	s := strings.Clone(text)
	p.Store(&s)
}
