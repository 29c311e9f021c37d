module github.com/tierlimit/tierlimit

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/dgraph-io/ristretto/v2 v2.4.2
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/sync v0.24.0
	golang.org/x/time v0.16.0
)

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
