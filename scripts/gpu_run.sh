#!/bin/bash
# Runs the GPU check from a bundle made by `make gpu-bundle` (see docs/GPU.md). Arguments go
# to gpu_check (--no-bench, case names). With compute-sanitizer on PATH and SANITIZE=1, the
# small cases also run under its memory checker. When this machine's python3 has a torch with
# CUDA, peer.py then times the same computations (and an encoder and an MLP block) eagerly and
# through torch.compile, beside dynamo's times from gpu_check's table (PEER=0: skip it).
here=$(cd "$(dirname "$0")" && pwd)
# gpu_check travels compressed (the bundle must fit a device call's 64 MiB): unpacked once here.
if [ ! -x "$here/gpu_check" ]; then
  { xz -dc "$here/gpu_check.xz" 2>/dev/null ||
    python3 -c "import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$here/gpu_check.xz"; } \
    > "$here/gpu_check.tmp" && chmod +x "$here/gpu_check.tmp" && mv "$here/gpu_check.tmp" "$here/gpu_check" ||
    { echo "run.sh: cannot unpack gpu_check.xz (neither xz nor python3's lzma)"; exit 2; }
fi
export DYNAMO_LIBDEVICE="$here/libdevice.10.bc"
# cuBLASLt for the model blocks' matrix products: the system's (libcublasLt.so*), else the one a
# pip-installed torch brings (nvidia-cublas), else the block cases say it is not installed.
if [ -z "${DYNAMO_LIBCUBLASLT:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libcublasLt.so; then
  lt=$(python3 -c "import glob, os, nvidia.cublas as m; print(sorted(glob.glob(os.path.join(list(m.__path__)[0], 'lib', 'libcublasLt.so*')))[-1])" 2>/dev/null)
  [ -n "$lt" ] && export DYNAMO_LIBCUBLASLT="$lt" && echo "cuBLASLt: $lt"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
log=$(mktemp /tmp/gpu_check.XXXXXX)
trap 'rm -f "$log"' EXIT
"$here/gpu_check" "$here/refs" "$@" | tee "$log"
rc=${PIPESTATUS[0]}
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck), small cases"
  compute-sanitizer --tool memcheck --print-limit 5 "$here/gpu_check" "$here/refs" --no-bench \
    chain_math_f32 tiled_bias scalar_inputs broadcast strided_view half_types tiny_and_empty softmax_odd row_stats short_rows \
    column_sums whole_tensor 2>&1 | tail -8
fi
if [ "${PEER:-1}" = 1 ] && command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "== the peer: torch eager and torch.compile on this GPU"
  timeout 600 python3 "$here/peer.py" --gpu-check-log "$log"
fi
exit $rc
