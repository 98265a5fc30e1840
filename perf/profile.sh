#!/usr/bin/env bash
# Profiles a benchmark with Linux perf and prints the hottest symbols; JIT code shows up by
# trace and kernel name through the perf map dynamo writes with DYNAMO_PERF_MAP=1.
#   perf/profile.sh [COMMAND...]     (default: build/perf/bench_reduce softmax)
set -euo pipefail
if ! command -v perf >/dev/null; then
  echo "profile.sh: Linux perf is not installed (Debian: apt-get install linux-perf)" >&2
  exit 1
fi
cmd=("$@")
if [ ${#cmd[@]} -eq 0 ]; then cmd=(build/perf/bench_reduce softmax); fi
out=$(mktemp /tmp/dynamo-perf.XXXXXX)
trap 'rm -f "$out"' EXIT
DYNAMO_PERF_MAP=1 perf record -q -F 999 -o "$out" -- "${cmd[@]}" >/dev/null
perf report -i "$out" --stdio --sort dso,symbol 2>/dev/null | grep -E "^ +[0-9]" | cut -c1-110 | head -15
