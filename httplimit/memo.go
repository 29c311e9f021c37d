package httplimit

import (
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"unsafe"
)

// memoSlots is the number of addresses a trustMemo holds (1<<memoBits): a
// fleet of proxies in front of a service is this size or smaller.
const (
	memoBits  = 5
	memoSlots = 1 << memoBits
)

// trustMemo remembers the text of addresses found to be trusted proxies,
// as they are written in RemoteAddr or a proxy header, so that a request
// from a known proxy is not parsed and matched against every trusted
// prefix again: about 40 ns for each IPv6 peer or hop, 20 for an IPv4 one,
// against a lookup under 10. Proxies are few and every request behind
// them names them, so nearly every lookup hits. A peer that is not a
// proxy (a client that reaches the service past them) costs a lookup that
// misses.
//
// It is a fixed table indexed by a hash of the text; a text that lands on
// a taken slot replaces it now and then (see add). Only texts that parsed
// as trusted addresses are added, so a client cannot fill it, and a miss
// costs what the lookup saves plus, now and then, a copy of a trusted
// text. A trustMemo is safe for concurrent use; its methods do nothing on
// a nil *trustMemo.
type trustMemo struct {
	seed  maphash.Seed
	slots [memoSlots]atomic.Pointer[string]
}

func newTrustMemo() *trustMemo { return &trustMemo{seed: maphash.MakeSeed()} }

// slot returns text's slot, by a seeded hash of the whole text. A text
// chosen to collide can only evict a proxy (costing a parse), never be
// believed. (A multiplicative hash of the last four bytes, once kept here
// as the cheaper one, was not: with it BenchmarkOverheadPaired put the
// middleware 5-6% slower behind a Forwarded IPv6 proxy, and equal
// elsewhere.)
func (m *trustMemo) slot(text string) *atomic.Pointer[string] {
	return &m.slots[maphash.String(m.seed, text)>>(64-memoBits)]
}

// has reports whether text was added.
func (m *trustMemo) has(text string) bool {
	if m == nil {
		return false
	}
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
	if m == nil {
		return
	}
	p := m.slot(text)
	if p.Load() != nil && rand.Uint32()%memoReplace != 0 {
		return
	}
	s := strings.Clone(text)
	p.Store(&s)
}

// keySlots is the number of clients a keyMemo holds (1<<keyBits): more
// than the busiest clients of most services, in a table of 2 KiB and
// entries of 144 bytes. With 4,096 clients sending Zipf-distributed
// numbers of requests, 256 slots held the client of 61% of the requests,
// 32 slots of 36%.
const (
	keyBits  = 8
	keySlots = 1 << keyBits
)

// maxMemoText is the longest address text a keyMemo remembers: any IPv6
// address with a short zone.
const maxMemoText = 64

// keyMemo remembers the keys of IPv6 clients by the text of their
// address, without brackets and port, as it is written in RemoteAddr or a
// proxy header. A client it holds costs a lookup rather than a parse, a
// search of the trusted prefixes, and the formatting and allocation of its
// key; one it does not hold costs the lookup more: an IPv6 peer takes 19
// ns rather than 110 when held, 119 rather than 94 when not
// (BenchmarkClientIP, clients=one and many, memo=on and off). It pays
// where some clients send many requests, the clients a limiter is for:
// with 4,096 clients sending Zipf-distributed numbers of requests
// (clients=zipf), 61% of the lookups hit. IPv4 clients are not remembered:
// their parse costs about what a lookup that misses does.
//
// Only addresses that are not trusted proxies are added, with the key
// that any request naming them as the client gets, so a hit is the answer
// a parse would give. Clients choose their texts; like trustMemo it hashes
// the whole text, with a random seed. A client seen once lands on
// an empty slot, or replaces a taken one once in memoReplace tries; its
// entry holds its key, so that remembering it costs no allocation more.
// A keyMemo is safe for concurrent use; its methods do nothing on a nil
// *keyMemo.
type keyMemo struct {
	seed  maphash.Seed
	slots [keySlots]keySlot
}

// keySlot holds one remembered client.
type keySlot struct{ p atomic.Pointer[memoKey] }

// memoKey is a remembered client: the text of its address and its key,
// which point into buf, so that one allocation holds all three: the one
// the key costs anyway. buf is not written after the strings are made.
type memoKey struct {
	text, key string
	buf       [maxIPv6Text + maxMemoText]byte
}

func newKeyMemo() *keyMemo { return &keyMemo{seed: maphash.MakeSeed()} }

func (m *keyMemo) slot(text string) *keySlot {
	return &m.slots[maphash.String(m.seed, text)>>(64-keyBits)]
}

// lookup returns text's slot and the key remembered there for text, if
// any.
func (m *keyMemo) lookup(text string) (s *keySlot, key string, ok bool) {
	if m == nil {
		return nil, "", false
	}
	s = m.slot(text)
	if e := s.p.Load(); e != nil && e.text == text {
		return s, e.key, true
	}
	return s, "", false
}

// claim reports whether to remember the key of text in s, text's slot:
// if text is short enough and s is free or, now and then, taken. A nil s
// claims nothing.
func (s *keySlot) claim(text string) bool {
	if s == nil || len(text) > maxMemoText {
		return false
	}
	return s.p.Load() == nil || rand.Uint32()%memoReplace == 0
}

// remember stores key as the key of text and returns it.
func (s *keySlot) remember(text string, key []byte) string {
	e := new(memoKey)
	n := copy(e.buf[:], key)
	copy(e.buf[n:], text)
	e.key = unsafe.String(&e.buf[0], n)
	e.text = unsafe.String(&e.buf[n], len(text))
	s.p.Store(e)
	return e.key
}
