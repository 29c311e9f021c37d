package httplimit

import (
	"net/http"
	"net/netip"

	"github.com/tierlimit/tierlimit/internal/clientip"
)

// resolver finds a request's client address, as Middleware describes it,
// from its RemoteAddr and the proxy header. It is not changed after New.
type resolver struct {
	clientip.Resolver
	header string // canonical name of the header trusted proxies write
}

func newResolver(trusted []netip.Prefix, header string, v6bits int) resolver {
	return resolver{
		Resolver: clientip.Resolver{Trusted: trusted, Forwarded: header == HeaderForwarded, V6Bits: v6bits},
		header:   header,
	}
}

// clientIP returns the key of r's client. A RemoteAddr that is not an
// address (a Unix socket, say) is the key as it is; an empty one gives
// "", false.
func (rs *resolver) clientIP(r *http.Request) (string, bool) {
	return rs.ClientIP(r.RemoteAddr, r.Header[rs.header])
}
