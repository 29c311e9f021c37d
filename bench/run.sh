#!/usr/bin/env bash
# run.sh runs the benchmarks of this module in one `go test` run on
# throwaway redis-server processes (loopback, never the system Redis), saves
# the raw output in results/, and summarises it.
#
# By default it runs BenchmarkCompare: every strategy of tierlimit (local,
# hybrid, remote token bucket, remote GCRA) against x/time/rate (one limiter,
# and one per key in a sync.Map), sethvargo/go-limiter, ulule/limiter (memory
# and redis stores), throttled (goredisstore.v9) and redis_rate, on a hot
# key, 10k keys uniform and 10k keys Zipf, serial and parallel. It prints
# benchstat's table and cmd/compare's markdown tables (the ones in
# docs/comparison.md), and with IMG=dir writes cmd/compare's charts there
# (IMG=../docs/img regenerates the docs' charts).
#
# BENCH selects other benchmarks: the earlier sets are
#   - BenchmarkRemote, BenchmarkRemoteDenied: tierlimit's six remote limiters
#     against redis_rate;
#   - BenchmarkRemotePaired, BenchmarkRemoteDeniedPaired: the same with each
#     call of ours followed by one of redis_rate, timed apart: the ×redis_rate
#     metric is the ratio within the same seconds (steadier on a shared
#     machine; benchstat prints its median);
#   - BenchmarkHotKey, BenchmarkHotKeyParallel: hybrid against x/time/rate
#     and redis_rate on one hot key;
#   - BenchmarkZipf10k: hybrid against a sync.Map of x/time/rate limiters;
# for which cmd/ratio prints the ratios (RESULTS.md was made with
# BENCH='BenchmarkRemote|BenchmarkHotKey|BenchmarkZipf10k' BENCHTIME=1s).
#
# COUNT (default 5) is passed to -count and BENCHTIME (default 1s) to
# -benchtime: with the defaults BenchmarkCompare takes about 8 minutes on 2
# cores. Run nothing else heavy meanwhile.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
export TIERLIMIT_REQUIRE_REDIS=${TIERLIMIT_REQUIRE_REDIS:-1} # fail, don't skip, without redis-server
BENCH=${BENCH:-'BenchmarkCompare$'} # not BenchmarkComparePaired, whose lines cmd/ratio cannot read
out=results/${OUT:-all.txt}
mkdir -p results

go test -run '^$' -bench "$BENCH" -benchmem -benchtime="${BENCHTIME:-1s}" \
	-count="${COUNT:-5}" -timeout 60m ./... |
	tee "$out"

export PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v benchstat >/dev/null; then
	go install golang.org/x/perf/cmd/benchstat@latest
fi

echo
benchstat "$out"
if grep -q '^BenchmarkCompare/' "$out"; then
	echo
	go run ./cmd/compare ${IMG:+-img "$IMG"} "$out"
fi
if grep -v '^BenchmarkCompare/' "$out" | grep -q '^Benchmark'; then
	echo
	grep -v '^BenchmarkCompare/' "$out" | go run ./cmd/ratio
fi
