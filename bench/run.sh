#!/usr/bin/env bash
# run.sh benchmarks, in one `go test` run on throwaway redis-server processes
# (loopback, never the system Redis):
#   - BenchmarkRemote, BenchmarkRemoteDenied: tierlimit's six remote limiters
#     against redis_rate;
#   - BenchmarkHotKey, BenchmarkHotKeyParallel: hybrid against x/time/rate
#     and redis_rate on one hot key;
#   - BenchmarkZipf10k: hybrid against a sync.Map of x/time/rate limiters.
# It saves the raw output in results/all.txt, then prints benchstat's table
# and the median ratios of cmd/ratio (remote limiters to redis_rate; hybrid to
# xrate, redis_rate and syncmap_xrate).
#
# COUNT (default 5) is passed to -count. Run nothing else heavy meanwhile.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
export TIERLIMIT_REQUIRE_REDIS=${TIERLIMIT_REQUIRE_REDIS:-1} # fail, don't skip, without redis-server
mkdir -p results

go test -run '^$' -bench 'BenchmarkRemote|BenchmarkHotKey|BenchmarkZipf10k' -benchmem \
	-count="${COUNT:-5}" -timeout 60m ./... |
	tee results/all.txt

export PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v benchstat >/dev/null; then
	go install golang.org/x/perf/cmd/benchstat@latest
fi

echo
benchstat results/all.txt
echo
go run ./cmd/ratio results/all.txt
