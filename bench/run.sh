#!/usr/bin/env bash
# run.sh benchmarks tierlimit's six remote limiters against redis_rate on
# throwaway redis-server processes (loopback, never the system Redis), saves
# the raw output in results/remote.txt, and prints benchstat's table and each
# limiter's median ratio to redis_rate (cmd/ratio).
#
# COUNT (default 5) is passed to -count. Run nothing else heavy meanwhile.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
export TIERLIMIT_REQUIRE_REDIS=${TIERLIMIT_REQUIRE_REDIS:-1} # fail, don't skip, without redis-server
mkdir -p results

go test -run '^$' -bench 'BenchmarkRemote' -benchmem -count="${COUNT:-5}" -timeout 30m ./... |
	tee results/remote.txt

export PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v benchstat >/dev/null; then
	go install golang.org/x/perf/cmd/benchstat@latest
fi

echo
benchstat results/remote.txt
echo
go run ./cmd/ratio results/remote.txt
