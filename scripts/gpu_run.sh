#!/bin/bash
# Runs the GPU check from a bundle made by `make gpu-bundle` (see docs/GPU.md). Arguments go
# to gpu_check (--no-bench, case names). With compute-sanitizer on PATH and SANITIZE=1, the
# small cases also run under its memory checker.
here=$(cd "$(dirname "$0")" && pwd)
export DYNAMO_LIBDEVICE="$here/libdevice.10.bc"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
"$here/gpu_check" "$here/refs" "$@"
rc=$?
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck), small cases"
  compute-sanitizer --tool memcheck --print-limit 5 "$here/gpu_check" "$here/refs" --no-bench \
    chain_math_f32 tiled_bias scalar_inputs broadcast strided_view half_types tiny_and_empty softmax_odd row_stats short_rows \
    column_sums whole_tensor 2>&1 | tail -8
fi
exit $rc
