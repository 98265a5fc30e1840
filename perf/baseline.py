"""What eager PyTorch runs with in this process: the BLAS behind torch.mm, the allocator, the
threads. Every benchmark prints this line beside its speedups, so that a ratio can be read
against the baseline it was measured on (a reference BLAS or a page-faulting allocator makes any
JIT look fast).

    from baseline import describe      # perf/ on sys.path
    print("eager:", describe())
"""
import os
import re


def _mapped_libraries():
    """Paths of the shared objects mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[-1] for line in f if ".so" in line and "/" in line}
    except OSError:
        return set()


def blas():
    """The BLAS torch.mm calls here: 'OpenBLAS 0.3.21 (pthreads)', 'reference BLAS (netlib)', ..."""
    import torch
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # makes sure libblas is loaded and bound
    libs = _mapped_libraries()
    names = " ".join(os.path.basename(p) for p in libs)
    m = re.search(r"libopenblas(p|o)?-r([0-9.]+)\.so", names)
    if m:
        kind = {"p": "pthreads", "o": "OpenMP"}.get(m.group(1) or "", "serial")
        return f"OpenBLAS {m.group(2)} ({kind})"
    if "libmkl" in names:
        return "MKL"
    if "libblis" in names:
        return "BLIS"
    for p in libs:  # Debian's alternatives: /usr/lib/<triplet>/blas/libblas.so.3 is netlib's
        if os.path.basename(p).startswith("libblas.so") and "/blas/" in os.path.realpath(p):
            return "reference BLAS (netlib, slow: install libopenblas0-pthread)"
    return "unknown BLAS"


def allocator():
    """'glibc malloc', 'jemalloc (LD_PRELOAD)', or 'glibc malloc, MALLOC_MMAP_THRESHOLD_=...'."""
    names = " ".join(os.path.basename(p) for p in _mapped_libraries())
    if "libjemalloc" in names:
        return "jemalloc (LD_PRELOAD)"
    if "libtcmalloc" in names:
        return "tcmalloc (LD_PRELOAD)"
    tuned = [f"{k}={os.environ[k]}" for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ]
    return "glibc malloc" + (", " + ", ".join(tuned) if tuned else " (default settings)")


def describe():
    import torch
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads, BLAS {blas()}, {allocator()}"


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"  # Debian's libjemalloc2


def jemalloc_env():
    """The environment for a child process that runs with jemalloc (PyTorch's CPU tuning guide),
    or None when libjemalloc2 is not installed."""
    if not os.path.exists(JEMALLOC):
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = (JEMALLOC + " " + env.get("LD_PRELOAD", "")).strip()
    return env


if __name__ == "__main__":
    print(describe())
