// Package bench compares tierlimit-serve with envoyproxy/ratelimit, the
// reference RLS v3 server, built from the version go.mod requires: the
// same descriptor scenarios through both (TestConformance) and load side by
// side (TestLoad). Both servers run as processes on one redis-server that
// the tests start on a loopback port, and are driven by real gRPC clients.
// It is a module of its own, so that neither serve nor the library
// downloads the reference to build.
package bench
