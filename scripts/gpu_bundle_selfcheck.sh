#!/bin/bash
# Runs a GPU bundle (make gpu-bundle) here, without a GPU, against the stand-in driver and
# cuBLASLt of the tests (tests/c/fake_cuda.c, fake_cublaslt.c): the stand-in runs no kernels, so
# every case with a kernel must FAIL with its unwritten elements seen (the outputs are filled
# before each checked run), and none may crash. Cheap insurance before spending device time:
#   make gpu-bundle && bash scripts/gpu_bundle_selfcheck.sh [BUILD_DIR]
set -u
build=${1:-build}
bundle=gpu_bundle
for f in "$bundle/gpu_check.xz" "$build/tests/libfake_cuda.so" "$build/tests/libfake_cublaslt.so"; do
  [ -e "$f" ] || { echo "gpu_bundle_selfcheck: $f is missing (make gpu-bundle; make build)"; exit 2; }
done
export DYNAMO_LIBCUDA="$build/tests/libfake_cuda.so" DYNAMO_LIBCUBLASLT="$build/tests/libfake_cublaslt.so"
export DYNAMO_LIBDEVICE="$bundle/libdevice.10.bc" FAKE_CUDA_DEVICES=1
bin=$(mktemp /tmp/gpu_check.XXXXXX)
trap 'rm -f "$bin"' EXIT
xz -dc "$bundle/gpu_check.xz" > "$bin" && chmod +x "$bin"
out=$("$bin" "$bundle/refs" --no-bench 2>&1)
rc=$?
echo "$out" | tail -5
cases=$(grep -c '^      {"' tests/gpu/cases.h)
lines=$(echo "$out" | grep -cE '^(ok|FAIL) ')
if [ "$rc" -gt 1 ] || [ "$lines" -ne "$cases" ]; then
  echo "gpu_bundle_selfcheck: FAILED: gpu_check exited $rc with $lines case lines for $cases cases (a crash?)"
  exit 1
fi
if ! echo "$out" | grep -q "an element not written keeps the fill\|gpu -nan\|gpu nan"; then
  echo "gpu_bundle_selfcheck: FAILED: no case saw the unwritten fill (the check would miss a skipped write)"
  exit 1
fi
echo "gpu_bundle_selfcheck: ok ($cases cases ran through the bundle's run path on the stand-ins, none crashed)"
