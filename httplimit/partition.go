package httplimit

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// MinPartitionSecret is the shortest secret WithPartitionKey accepts, in
// bytes: a shorter one could be found by trying them all.
const MinPartitionSecret = 16

// pkLen is the length of a partition key: 128 bits, so that two keys of
// one limiter do not share one by chance.
const pkLen = 16

// limiterPK is a WithPartitionKey waiting for New to find its limiter.
type limiterPK struct {
	name   string
	secret []byte
}

// WithPartitionKey adds the pk parameter, the partition key of
// draft-ietf-httpapi-ratelimit-headers (§3.1.4, §4.1.3), to the items of
// the limiter whose policy is name: a client that acts for many users or
// API keys can then tell their quotas apart. The partition is the key the
// limiter is asked with; pk is not that key but the first 16 bytes of its
// HMAC-SHA256 under secret, so that responses, logs and caches never hold
// an API key, a user ID or an address, and nobody without secret can
// compute the pk of a key or find the key of a pk (draft §6.1 and §8.2).
// A client sees one stable pk per key and cannot predict it. Changing
// secret changes every pk. secret must be at least MinPartitionSecret
// bytes (32 random bytes are right); it is copied. New returns an error if
// no limiter has the policy name, or if two WithPartitionKey name one.
func WithPartitionKey(name string, secret []byte) Option {
	return optionFunc(func(c *config) error {
		if len(secret) < MinPartitionSecret {
			return invalid("partition key secret of %d bytes for policy %q: want at least %d", len(secret), name, MinPartitionSecret)
		}
		c.pks = append(c.pks, limiterPK{name: name, secret: append([]byte(nil), secret...)})
		return nil
	})
}

// applyPartitionKeys gives the limiters named by WithPartitionKey their
// partitioner: one per secret, so that serve computes the partition key
// of one key once for all the limiters that share it.
func applyPartitionKeys(byName map[string]*rule, pks []limiterPK) error {
	bySecret := map[string]*partitioner{}
	for _, p := range pks {
		r := byName[p.name]
		switch {
		case r == nil:
			return invalid("WithPartitionKey for policy %q: no limiter has that name", p.name)
		case r.pk != nil:
			return invalid("two WithPartitionKey for policy %q", p.name)
		}
		if bySecret[string(p.secret)] == nil {
			bySecret[string(p.secret)] = newPartitioner(p.secret)
		}
		r.pk = bySecret[string(p.secret)]
	}
	return nil
}

// partitioner computes the partition keys of one secret. It is safe for
// concurrent use.
type partitioner struct {
	pool sync.Pool // of *macState
}

// macState is one HMAC in use, with its buffers: pooled, so that a
// partition key costs no allocation.
type macState struct {
	mac hash.Hash
	in  []byte
	sum [sha256.Size]byte
}

func newPartitioner(secret []byte) *partitioner {
	p := &partitioner{}
	p.pool.New = func() any { return &macState{mac: hmac.New(sha256.New, secret)} }
	return p
}

// partitionKey writes the partition key of key to dst.
func (p *partitioner) partitionKey(dst *[pkLen]byte, key string) {
	s := p.pool.Get().(*macState)
	s.mac.Reset()
	s.in = append(s.in[:0], key...)
	s.mac.Write(s.in)
	copy(dst[:], s.mac.Sum(s.sum[:0]))
	p.pool.Put(s)
}
