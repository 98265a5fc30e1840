# The commands a person types. The real build is CMakeLists.txt; this file only sequences it.
# The project's Python: .venv/ made from requirements.txt by scripts/setup-python.sh.
VENV   ?= .venv
PYTHON ?= $(CURDIR)/$(VENV)/bin/python
BUILD  ?= build
# The other CPython versions the package supports: each gets its venv (.venv-3.12, ...), the
# extensions built for it, and the Python suite run on it by `make test` (skipped, with a line
# saying so, where the machine has no such Python). MORE_PYTHONS= builds for 3.11 alone.
MORE_PYTHONS ?= 3.12 3.13
PREFIX ?= $(CURDIR)/$(VENV)
JOBS   ?= 2
MAKEFLAGS += --no-print-directory
# bash with pipefail: `ctest | grep` must fail when ctest fails.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: all deps configure build test test-asan fuzz fuzz-programs soak bench check-math demo zoo wheel install uninstall clean gpu-bundle

all: build

deps:
	@bash scripts/setup-deps.sh
	@VENV=$(VENV) bash scripts/setup-python.sh requirements.txt
	@for v in $(MORE_PYTHONS); do PYTHON_VERSION=$$v VENV=.venv-$$v OPTIONAL=1 bash scripts/setup-python.sh requirements.txt; done

configure: deps
	@more=$$(for v in $(MORE_PYTHONS); do [ -x .venv-$$v/bin/python ] && printf '%s;' "$(CURDIR)/.venv-$$v/bin/python"; done; true); \
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) -DPython3_EXECUTABLE=$(PYTHON) \
	  -DDYNAMO_MORE_PYTHONS="$${more%;}" >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -V -j1 | grep -vE "^[0-9]+: (Test command|Working Directory|Environment variables|Test timeout|  )"

# AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/) of the library and the C
# suites that use only the public API, run with leak checks off (LLVM and LibTorch keep
# process-lifetime allocations).
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer
ASAN_TESTS := test_text test_capi test_adversarial test_guards test_exits test_threads test_gpu_driver
test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON) \
	  -DCMAKE_C_FLAGS="$(ASAN_FLAGS)" -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(ASAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(ASAN_FLAGS)" >/dev/null
	@cmake --build build-asan -j$(JOBS) --target $(ASAN_TESTS) fake_cuda fake_cuda_old fake_cublaslt
	@export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1; \
	fail=0; for t in $(ASAN_TESTS); do echo "== $$t (asan+ubsan)"; \
	  out=$$(build-asan/tests/$$t 2>&1) || { echo "$$out" | tail -40; fail=1; }; echo "$$out" | tail -2; done; \
	out=$$(GPU_CASE=one FAKE_CUDA_DEVICES=1 DYNAMO_LIBCUDA=build-asan/tests/libfake_cuda.so \
	  DYNAMO_LIBCUBLASLT=build-asan/tests/libfake_cublaslt.so build-asan/tests/test_gpu_driver 2>&1) || \
	  { echo "$$out" | tail -40; fail=1; }; echo "$$out" | tail -1; \
	[ $$fail = 0 ] && echo "test-asan: clean" || { echo "test-asan: FAILED"; exit 1; }

# libFuzzer (clang): the IR parser/printer/verifier (fuzz_trace), the C API run path with random
# argument metadata (fuzz_run), and any text through parse, compile and run (fuzz_compile);
# FUZZ_SECONDS each (default 60), starting from tests/fuzz/corpus/*, with the dictionary
# tests/fuzz/dict/trace.dict (sizes past int64, device suffixes, shape-making ops) for the text
# targets. A run over FUZZ_TIMEOUT seconds (default 10) counts as a hang and fails. A trace may
# ask for more memory than there is (valid sizes, terabytes of output): the allocator returns
# NULL instead of aborting, and the library must answer DYNAMO_ERR_OUT_OF_MEMORY.
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_FLAGS := -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined
FUZZ_CXX := clang++-19
fuzz: build
	@bash scripts/setup-deps.sh clang-19 libclang-rt-19-dev
	@$(FUZZ_CXX) $(FUZZ_FLAGS) -Ijit tests/fuzz/fuzz_trace.cpp jit/ir.cpp jit/text.cpp jit/verify.cpp \
	  jit/passes.cpp jit/decompose.cpp -o $(BUILD)/fuzz_trace
	@for t in run compile; do $(FUZZ_CXX) $(FUZZ_FLAGS) -Icapi tests/fuzz/fuzz_$$t.cpp \
	  -o $(BUILD)/fuzz_$$t -L$(BUILD) -ldynamo -Wl,-rpath,$(CURDIR)/$(BUILD) || exit 1; done
	@export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 DYNAMO_CACHE_DIR=off; fail=0; for t in trace run compile; do \
	  seeds=$$t; dict=; [ $$t = run ] || { seeds=trace; dict=-dict=$(CURDIR)/tests/fuzz/dict/trace.dict; }; \
	  work=$$(mktemp -d); cp tests/fuzz/corpus/$$seeds/* $$work/; \
	  echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  (cd $$work && $(CURDIR)/$(BUILD)/fuzz_$$t $$dict -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -malloc_limit_mb=1048576 \
	    -print_final_stats=1 . > $$work.log 2>&1; rc=$$?; \
	    grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)|ERROR|SUMMARY|timeout|^fuzz_compile:" $$work.log; \
	    [ $$rc = 0 ] || { echo "fuzz_$$t: exit $$rc; the input that failed: $$(ls $$work/crash-* $$work/timeout-* 2>/dev/null)"; \
	      mkdir -p $(CURDIR)/$(BUILD)/fuzz-failures; cp $$work/crash-* $$work/timeout-* $(CURDIR)/$(BUILD)/fuzz-failures/ 2>/dev/null; \
	      exit 1; }) || fail=1; \
	  rm -rf $$work $$work.log; done; [ $$fail = 0 ] && echo "fuzz: clean" || { echo "fuzz: FAILED (inputs in $(BUILD)/fuzz-failures)"; exit 1; }

# The program fuzzer: FUZZ_PROGRAMS random PyTorch programs (hypothesis), eager vs. dynamo.optimize,
# shrunk failures printed and saved as reproducers under $(BUILD)/fuzz-programs/.
FUZZ_PROGRAMS ?= 20000
fuzz-programs: build
	@PYTHONPATH=python_shim DYNAMO_LIBRARY=$(BUILD)/libdynamo.so.0 $(PYTHON) tests/fuzz_programs/run.py \
	  --programs $(FUZZ_PROGRAMS) --save $(BUILD)/fuzz-programs

# The long soak: 10^5 compiled calls and 300 compile/reset cycles, memory figures printed.
soak: build
	@PYTHONPATH=python_shim DYNAMO_LIBRARY=$(BUILD)/libdynamo.so.0 DYNAMO_SOAK_CALLS=100000 DYNAMO_SOAK_CYCLES=300 \
	  $(PYTHON) -m pytest -q tests/python/test_soak.py

bench: build
	@$(BUILD)/perf/bench_pointwise && echo && $(BUILD)/perf/bench_reduce && echo && \
	  PYTHONPATH=python_shim DYNAMO_LIBRARY=$(BUILD)/libdynamo.so.0 $(PYTHON) perf/bench_python.py

# Every float32 input through the JIT's exp/sigmoid/erf/tanh vs. double libm (a few minutes).
check-math: build
	@$(BUILD)/perf/math_accuracy

# The GPU suite + benchmark for a machine with an NVIDIA driver (no LLVM or LibTorch needed
# there): gpu_bundle/ holds a static gpu_check (xz-compressed: the bundle fits a 64 MiB transfer),
# libdevice, and the CPU engine's results for the same traces, every element (large outputs by
# one period of inputs that repeat). Run it there with `bash gpu_bundle/run.sh` (docs/GPU.md).
gpu-bundle: build
	@cmake --build $(BUILD) -j$(JOBS) --target gpu_check gpu_refs
	@rm -rf gpu_bundle && mkdir -p gpu_bundle/refs
	@strip -o $(BUILD)/gpu_check.stripped $(BUILD)/gpu_check
	@xz -T$(JOBS) -6 -c $(BUILD)/gpu_check.stripped > gpu_bundle/gpu_check.xz
	@cp $${CUDA_HOME:-/usr/local/cuda}/nvvm/libdevice/libdevice.10.bc gpu_bundle/
	@cp scripts/gpu_run.sh gpu_bundle/run.sh
	@cp scripts/gpu_peer.py gpu_bundle/peer.py
	@echo "gpu-bundle: CPU results for $$(grep -c '^      {"' tests/gpu/cases.h) traces (the large ones take a minute)"
	@$(BUILD)/tests/gpu_refs gpu_bundle/refs | tail -3
	@du -sh gpu_bundle | sed 's/^/gpu-bundle: /'
	@bash scripts/gpu_bundle_selfcheck.sh $(BUILD) | tail -1

demo: build
	@PYTHONPATH=python_shim $(PYTHON) examples/python/demo.py

# The model zoo (perf/models.py): torchvision, timm and Hugging Face models and torch.nn blocks
# (random weights, batch 1), each in its own process with cold caches: eager torch 2.14,
# torch.compile (Inductor, weight freezing), dynamo.optimize and torch.compile(backend="dynamo"):
# WRONG / LEAKED / ok, each side's ms, dynamo over eager and over torch.compile, both first calls,
# geomeans per family, a chart in $(BUILD)/zoo.png (every result in zoo.json); fails on any WRONG or LEAKED.
# About 45 minutes on two cores
# (Inductor's cold compiles are most of it); MODELS=resnet18,hf.bert runs only those;
# ZOO_ARGS="--family timm,hf" (or --sides, --all-torchvision, --calls, --timeout, --json, ...).
MODELS ?=
ZOO_ARGS ?=
zoo: build
	@PYTHONPATH=python_shim DYNAMO_LIBRARY=$(BUILD)/libdynamo.so.0 $(PYTHON) perf/models.py \
	  --png $(BUILD)/zoo.png --json $(BUILD)/zoo.json $(if $(MODELS),--models $(MODELS)) $(ZOO_ARGS)

# The Python package is built the way pip builds it for a user (pyproject.toml: CMake through
# scikit-build-core), its CMake build kept in $(BUILD)/wheel so that a second run rebuilds only
# what changed. `make wheel`: dist/dynamo-*.whl. `make install`: the C library, header, CMake
# package and pkg-config file into PREFIX (default: the venv), and the Python package into the
# venv with pip.
PIP := $(PYTHON) -m pip --disable-pip-version-check
WHEEL_BUILD := -C build-dir=$(CURDIR)/$(BUILD)/wheel
wheel: deps
	@$(PIP) wheel --no-deps -q $(WHEEL_BUILD) -w dist .
	@ls dist/dynamo-*.whl

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)
	@$(PIP) install --no-deps -q $(WHEEL_BUILD) .
	@echo "installed: the C library under $(PREFIX), the Python package into $(VENV) ($$($(PIP) show dynamo | grep ^Location))"

# Removes what `make install` wrote: the files of the C install (its manifest) and the Python
# package (pip uninstall).
uninstall:
	@if [ -f $(BUILD)/install_manifest.txt ]; then \
	  xargs rm -f < $(BUILD)/install_manifest.txt; \
	  echo "removed files listed in $(BUILD)/install_manifest.txt"; \
	else echo "no C install from $(BUILD)"; fi
	@if [ -x $(PYTHON) ] && $(PIP) show -q dynamo 2>/dev/null; then $(PIP) uninstall -y -q dynamo && \
	  echo "removed the Python package from $(VENV)"; fi

clean:
	@rm -rf $(BUILD) dist
