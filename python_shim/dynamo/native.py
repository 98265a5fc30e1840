"""Thin Python objects over the C API: Engine, Frame, Trace and Entry, with torch tensors in and out."""
import contextlib
import ctypes

import torch

from . import _capi
from ._capi import DynamoError

_lib = None

_TORCH_DL = {
    torch.bool: (_capi.DYNAMO_DL_BOOL, 8),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
    torch.float32: (2, 32),
    torch.float64: (2, 64),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
}
_DTYPE_TORCH = [torch.bool, torch.int32, torch.int64, torch.float32, torch.float64, torch.float16, torch.bfloat16]


def lib():
    global _lib
    if _lib is None:
        _lib = _capi.load_library()
    return _lib


_load_error = None


def load_error():
    """None when libdynamo loads, else why it does not (tried once: `import dynamo` says it on
    stderr, and every optimized function then runs eagerly)."""
    global _load_error
    if _lib is None and _load_error is None:
        try:
            lib()
        except ImportError as e:
            _load_error = str(e)
    return _load_error


def _check(status):
    if status != 0:
        L = lib()
        raise DynamoError(L.dynamo_status_name(status).decode(), L.dynamo_last_error().decode())


class _TensorRef:
    """A DLTensor describing a torch CPU tensor (borrowed: keep the tensor alive)."""

    __slots__ = ("dl", "shape", "strides", "tensor")

    def __init__(self, t):
        if t.dtype not in _TORCH_DL:
            raise TypeError(f"dynamo: unsupported dtype {t.dtype}")
        code, bits = _TORCH_DL[t.dtype]
        self.tensor = t
        n = t.dim()
        self.shape = (ctypes.c_int64 * max(n, 1))(*t.shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*t.stride())
        dev = 1 if t.device.type == "cpu" else 2
        self.dl = _capi.DLTensor(t.data_ptr() or None, _capi.DLDevice(dev, t.device.index or 0), n,
                                 _capi.DLDataType(code, bits, 1), self.shape, self.strides, 0)


def make_args(values):
    """Flattens Python values (tensors, ints, floats, bools) into a dynamo_arg array."""
    arr = (_capi.DynamoArg * max(len(values), 1))()
    keep = []
    for k, v in enumerate(values):
        a = arr[k]
        if isinstance(v, torch.Tensor):
            r = _TensorRef(v)
            keep.append(r)
            a.kind = _capi.ARG_TENSOR
            a.flags = _capi.ARG_FLAG_REQUIRES_GRAD if v.requires_grad else 0
            a.u.tensor = ctypes.pointer(r.dl)
        elif isinstance(v, bool):
            a.kind, a.u.b = _capi.ARG_BOOL, int(v)
        elif isinstance(v, int):
            a.kind, a.u.i = _capi.ARG_INT, v
        elif isinstance(v, float):
            a.kind, a.u.f = _capi.ARG_FLOAT, v
        else:
            raise TypeError(f"dynamo: cannot pass {type(v).__name__} as a trace input")
    return arr, keep


class Engine:
    """An engine for the CPU (device None) or a CUDA device (torch.device('cuda', i)): raises
    DynamoError (DYNAMO_ERR_NO_DEVICE, saying why) when there is no driver or device."""

    def __init__(self, device=None):
        h = ctypes.c_void_p()
        opts = None
        if device is not None and device.type == "cuda":
            opts = _capi.EngineOptions()
            lib().dynamo_engine_options_init(ctypes.byref(opts))
            opts.device_type, opts.device_index = _capi.KDL_CUDA, device.index or 0
        _check(lib().dynamo_engine_create(ctypes.byref(opts) if opts is not None else None, ctypes.byref(h)))
        self.handle = h
        self.device = device

    def close(self):
        if self.handle:
            _check(lib().dynamo_engine_destroy(self.handle))
            self.handle = None


class Trace:
    def __init__(self, text):
        h = ctypes.c_void_p()
        data = text.encode()
        _check(lib().dynamo_trace_parse(data, len(data), ctypes.byref(h)))
        self.handle = h

    def text(self):
        return _taken_string(lambda p: lib().dynamo_trace_print(self.handle, p))

    def __del__(self):
        if getattr(self, "handle", None) and _lib is not None:
            _lib.dynamo_trace_destroy(self.handle)


def _taken_string(call):
    """The string a C API call hands over (char **, freed with dynamo_string_free)."""
    p = ctypes.c_void_p()
    _check(call(ctypes.byref(p)))
    try:
        return ctypes.string_at(p).decode()
    finally:
        lib().dynamo_string_free(p)


def cache_directory():
    """The disk cache's directory (dynamo_cache_directory), or None when it is off or refused."""
    try:
        return _taken_string(lambda p: lib().dynamo_cache_directory(p))
    except DynamoError:
        return None


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def wrap_managed(ptr):
    """A torch tensor owning an engine-allocated DLManagedTensor (no copy); when the tensor dies
    its memory returns to the engine's buffer pool."""
    return torch.utils.dlpack.from_dlpack(_capsule_new(ptr, b"dltensor", None))


def take_exit():
    """(exit id, live values as tensors) of the side exit the last run on this thread took."""
    L = lib()
    eid, n = ctypes.c_int32(), ctypes.c_size_t()
    st = L.dynamo_take_exit(ctypes.byref(eid), None, 0, ctypes.byref(n))
    if st == 0:  # an exit without live values: taken already
        return eid.value, []
    if st != _capi.STATUS_ARGUMENT_MISMATCH:  # the capacity is too small; n says how many
        _check(st)
    vals = (ctypes.c_void_p * max(n.value, 1))()
    _check(L.dynamo_take_exit(ctypes.byref(eid), vals, n.value, ctypes.byref(n)))
    return eid.value, [wrap_managed(vals[k]) for k in range(n.value)]


def collect_outputs(ptrs, aliases, shapes, inputs):
    """Torch tensors for the outputs of dynamo_entry_run_alloc: engine buffers wrapped without a
    copy; outputs that alias an input become views of that input, as eager returns them."""
    outs = []
    for k, alias in enumerate(aliases):
        if alias is None:
            outs.append(wrap_managed(ptrs[k]))
        else:
            src = inputs[alias[0]]
            outs.append(src.as_strided(shapes[k], alias[2], src.storage_offset() + alias[1]))
    return outs


class Entry:
    def __init__(self, handle):
        self.handle = handle

    def output_specs(self):
        L = lib()
        specs = []
        for k in range(L.dynamo_entry_num_outputs(self.handle)):
            info = _capi.TensorInfo()
            _check(L.dynamo_entry_output_info(self.handle, k, ctypes.byref(info)))
            specs.append((_DTYPE_TORCH[info.dtype], tuple(info.sizes[: info.ndim])))
        return specs

    def output_aliases(self):
        """Per output: None, or (input index, storage offset in elements, strides) when the output
        is a view of that input after the call (returned without a copy, as eager does)."""
        L = lib()
        res = []
        for k in range(L.dynamo_entry_num_outputs(self.handle)):
            a = _capi.OutputAlias()
            _check(L.dynamo_entry_output_alias(self.handle, k, ctypes.byref(a)))
            res.append(None if a.input < 0 else (a.input, a.offset, tuple(a.strides[: a.ndim])))
        return res

    def choices(self):
        """What the entry's convolution and product steps chose by timing ("3=onednn 7=blas")."""
        return _taken_string(lambda p: lib().dynamo_entry_choices(self.handle, p))

    def profile(self):
        """DYNAMO_PROFILE's times of this entry: (runs, total ns, [(step, runs, ns, what)]), or
        None when the entry was not profiled."""
        try:
            text = _taken_string(lambda p: lib().dynamo_entry_profile(self.handle, p))
        except DynamoError:
            return None
        lines = text.splitlines()
        if not lines:
            return None
        _, runs, ns = lines[0].split(" ", 2)
        steps = []
        for line in lines[1:]:
            _, i, n, t, what = line.split(" ", 4)
            steps.append((int(i), int(n), int(t), what))
        return int(runs), int(ns), steps

    def set_choices(self, text):
        _check(lib().dynamo_entry_set_choices(self.handle, text.encode()))

    def stats(self):
        s = _capi.EntryStats()
        s.struct_size = ctypes.sizeof(s)
        _check(lib().dynamo_entry_get_stats(self.handle, ctypes.byref(s)))
        return s


class Frame:
    def __init__(self, engine, name="frame"):
        h = ctypes.c_void_p()
        _check(lib().dynamo_frame_create(engine.handle, name.encode(), ctypes.byref(h)))
        self.handle = h

    def compile(self, trace):
        e = ctypes.c_void_p()
        _check(lib().dynamo_compile_frame(self.handle, trace.handle, ctypes.byref(e)))
        return Entry(e)

    def add_sized(self, text):
        """Adds IR text whose sizes may be products of the size variables s0..s7 as a sized trace
        (dynamo_frame_add_sized): a later run at sizes no entry takes compiles it at those sizes.
        Returns its index in the frame."""
        data = text.encode()
        index = ctypes.c_int32(-1)
        _check(lib().dynamo_frame_add_sized(self.handle, data, len(data), ctypes.byref(index)))
        return index.value

    def num_entries(self):
        return lib().dynamo_frame_num_entries(self.handle)

    def run(self, *values):
        """Checks guards and runs; returns a list of tensors. Fresh outputs are allocated by the
        engine (recycled memory, handed over through DLPack); outputs that alias an input are
        returned as views of it, as eager does."""
        args, keep = make_args(values)
        e = ctypes.c_void_p()
        why = ctypes.create_string_buffer(512)
        _check(lib().dynamo_check_guards(self.handle, args, len(values), ctypes.byref(e), why, 512))
        entry = Entry(e)
        specs, aliases = entry.output_specs(), entry.output_aliases()
        n = len(specs)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        _check(lib().dynamo_entry_run_alloc(e, args, len(values), ptrs, n))
        return collect_outputs(ptrs, aliases, [s for _, s in specs], values)

    def close(self):
        if self.handle:
            _check(lib().dynamo_frame_destroy(self.handle))
            self.handle = None


@contextlib.contextmanager
def blas_one_thread():
    """OpenBLAS held to one thread (dynamo_blas_hold) for the block: a recording runs the forward
    op by op, and a threaded OpenBLAS fights ATen's spinning OpenMP threads for the cores between
    ops (resnet50 at 64x64 on 2 cores: eager's first call 78-187 ms with OpenBLAS's 2 threads,
    25-31 ms with one). Process-wide and counted, restored by the last release. Only speed
    depends on it: without the library (it failed to load) the block runs unheld."""
    try:
        L = lib()
    except ImportError:
        yield
        return
    L.dynamo_blas_hold(1)
    try:
        yield
    finally:
        L.dynamo_blas_hold(0)
