package redistest

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port in front of a server, for
// fault tests: it can reset a share of the connections it carries. Its
// methods are safe for concurrent use.
//
// It is a few lines of io.Copy: the one fault it injects did not justify
// running toxiproxy's server in process.
type Proxy struct {
	// Addr is the proxy's address, "127.0.0.1:port": give it to clients.
	Addr string

	upstream string
	ln       net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	rng    *rand.Rand
	share  float64 // of new connections to reset
	within time.Duration
	conns  map[net.Conn]struct{}
	resets int
}

// StartProxy starts a proxy to upstream and registers t.Cleanup to stop it.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{
		Addr: ln.Addr().String(), upstream: upstream, ln: ln,
		rng: rand.New(rand.NewPCG(1, 2)), conns: map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// ResetConnections makes the proxy reset (TCP RST) each connection it
// accepts from now on with probability share, at a random instant within
// the given time of its opening: mid-command, often.
func (p *Proxy) ResetConnections(share float64, within time.Duration) {
	p.mu.Lock()
	p.share, p.within = share, within
	p.mu.Unlock()
}

// Resets returns the number of connections the proxy has reset.
func (p *Proxy) Resets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// Close stops the proxy and closes every connection it carries.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	var resetAfter time.Duration = -1
	if p.share > 0 && p.rng.Float64() < p.share {
		resetAfter = time.Duration(p.rng.Int64N(int64(p.within) + 1))
	}
	p.mu.Unlock()
	if resetAfter >= 0 {
		t := time.AfterFunc(resetAfter, func() {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close sends RST
			}
			p.mu.Lock()
			p.resets++
			p.mu.Unlock()
			c.Close()
			up.Close()
		})
		defer t.Stop()
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
