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
    if torch.backends.mkl.is_available():  # (the torch wheel links MKL in statically)
        return "MKL (inside libtorch_cpu)"
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


def _openblas():
    """The mapped OpenBLAS as a ctypes library (openblas_get/set_num_threads), or None."""
    import ctypes
    import torch
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # libblas loaded and bound
    for p in sorted(_mapped_libraries()):
        name = os.path.basename(p)
        if name.startswith("libopenblas") or name.startswith("libblas"):
            try:
                lib = ctypes.CDLL(p, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                lib.openblas_get_num_threads.restype = ctypes.c_int
                lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
                return lib
            except (OSError, AttributeError):
                continue
    return None


class openblas_threads:
    """`with openblas_threads(1):` runs the block with OpenBLAS on that many threads, as
    OPENBLAS_NUM_THREADS=1 would (a user's remedy for OpenBLAS's threads fighting ATen's
    spinning OpenMP threads on few cores); does nothing without OpenBLAS. `available` says
    whether the process has one."""

    _lib = False

    def __init__(self, n):
        if openblas_threads._lib is False:
            openblas_threads._lib = _openblas()
        self.n, self.saved = n, None

    @classmethod
    def available(cls):
        if cls._lib is False:
            cls._lib = _openblas()
        return cls._lib is not None

    def __enter__(self):
        if self._lib is not None:
            self.saved = self._lib.openblas_get_num_threads()
            self._lib.openblas_set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            self._lib.openblas_set_num_threads(self.saved)


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
