"""ctypes binding of libdynamo's C API (capi/dynamo.h): loading, ABI check, DLPack structs."""
import ctypes
import os

ABI_VERSION = 1
ABI_MINOR = 5      # the least DYNAMO_ABI_MINOR this package needs (dynamo_abi_minor_version)
DYNAMO_DL_BOOL = 6


class DynamoError(RuntimeError):
    """A dynamo C API call failed; .status is the status name, str() the library's message."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]


class _ArgUnion(ctypes.Union):
    _fields_ = [("tensor", ctypes.POINTER(DLTensor)), ("i", ctypes.c_int64), ("f", ctypes.c_double),
                ("b", ctypes.c_int32)]


class DynamoArg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("flags", ctypes.c_uint32), ("u", _ArgUnion)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32), ("sizes", ctypes.c_int64 * 16)]


class OutputAlias(ctypes.Structure):
    _fields_ = [("input", ctypes.c_int32), ("ndim", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("strides", ctypes.c_int64 * 16)]


class EntryStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_kernels", ctypes.c_uint32),
                ("num_externs", ctypes.c_uint32), ("num_instructions", ctypes.c_uint32),
                ("compile_ms", ctypes.c_double), ("from_cache", ctypes.c_uint32),
                ("shared_code", ctypes.c_uint32), ("kept_steps", ctypes.c_uint32),
                ("kept_computes", ctypes.c_uint32)]


class EngineOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("opt_level", ctypes.c_uint32), ("vector_bits", ctypes.c_uint32),
                ("num_threads", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("pool_bytes", ctypes.c_uint64),
                ("device_type", ctypes.c_int32), ("device_index", ctypes.c_int32)]


KDL_CPU, KDL_CUDA = 1, 2
ARG_TENSOR, ARG_INT, ARG_FLOAT, ARG_BOOL = 0, 1, 2, 3
# The C API's status codes by name (DYNAMO_ stripped), read from the library's own table
# (dynamo.h's DYNAMO_STATUS_LIST, through dynamo_status_name) by load_library: Python spells no
# code's number. The codes the shim acts on must be there, or the import fails.
STATUS = {}
STATUS_GUARD_MISS = STATUS_ARGUMENT_MISMATCH = STATUS_EXIT = None
_STATUS_NEEDED = ("OK", "ERR_GUARD_MISS", "ERR_ARGUMENT_MISMATCH", "EXIT")
ARG_FLAG_REQUIRES_GRAD = 1


def _candidates():
    env = os.environ.get("DYNAMO_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, "libdynamo.so.0"),                       # installed package (pip install .)
        os.path.join(here, "..", "..", "build", "libdynamo.so.0"),  # source checkout after `make`
        "libdynamo.so.0",                                           # the system linker's path
    ]


def load_library():
    """Loads libdynamo (DYNAMO_LIBRARY overrides the search) and checks its ABI version."""
    import torch  # noqa: F401  -- libdynamo shares libtorch_cpu.so with the torch package

    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path} ({e})")
    else:
        raise ImportError("dynamo: cannot load libdynamo; tried: " + "; ".join(tried) +
                          ". Install the package (pip install .), run `make` in the source tree, or set DYNAMO_LIBRARY.")
    _declare(lib)
    got = lib.dynamo_abi_version()
    if got != ABI_VERSION:
        raise ImportError(f"dynamo: {path} has ABI version {got}, this package needs {ABI_VERSION}")
    minor = lib.dynamo_abi_minor_version()
    if minor < ABI_MINOR:
        raise ImportError(f"dynamo: {path} has ABI minor version {minor}, this package needs {ABI_MINOR} or later")
    _read_status_table(lib, path)
    return lib


def _read_status_table(lib, path):
    global STATUS_GUARD_MISS, STATUS_ARGUMENT_MISMATCH, STATUS_EXIT
    table = {}
    for code in range(256):  # codes are small and stable; unknown ones are named DYNAMO_ERR_UNKNOWN
        said = (lib.dynamo_status_name(code) or b"").decode()
        if said.startswith("DYNAMO_") and said != "DYNAMO_ERR_UNKNOWN":
            table[said[len("DYNAMO_"):]] = code
    missing = [n for n in _STATUS_NEEDED if n not in table]
    if missing:
        raise ImportError(f"dynamo: {path} has no status " + ", ".join("DYNAMO_" + n for n in missing))
    STATUS.clear()
    STATUS.update(table)
    STATUS_GUARD_MISS, STATUS_ARGUMENT_MISMATCH, STATUS_EXIT = (table["ERR_GUARD_MISS"],
                                                                table["ERR_ARGUMENT_MISMATCH"], table["EXIT"])


def _declare(lib):
    P = ctypes.c_void_p
    st = ctypes.c_int
    sig = {
        "dynamo_last_error": (ctypes.c_char_p, []),
        "dynamo_status_name": (ctypes.c_char_p, [st]),
        "dynamo_abi_version": (ctypes.c_uint32, []),
        "dynamo_abi_minor_version": (ctypes.c_uint32, []),
        "dynamo_version_string": (ctypes.c_char_p, []),
        "dynamo_string_free": (None, [P]),
        "dynamo_engine_options_init": (None, [ctypes.POINTER(EngineOptions)]),
        "dynamo_engine_create": (st, [ctypes.POINTER(EngineOptions), ctypes.POINTER(P)]),
        "dynamo_gpu_available": (st, [ctypes.c_char_p, ctypes.c_size_t]),
        "dynamo_engine_destroy": (st, [P]),
        "dynamo_trace_parse": (st, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(P)]),
        "dynamo_trace_print": (st, [P, ctypes.POINTER(P)]),
        "dynamo_trace_destroy": (None, [P]),
        "dynamo_frame_create": (st, [P, ctypes.c_char_p, ctypes.POINTER(P)]),
        "dynamo_frame_destroy": (st, [P]),
        "dynamo_frame_num_entries": (ctypes.c_size_t, [P]),
        "dynamo_compile_frame": (st, [P, P, ctypes.POINTER(P)]),
        "dynamo_frame_add_sized": (st, [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)]),
        "dynamo_frame_num_sized": (ctypes.c_size_t, [P]),
        "dynamo_check_guards": (st, [P, ctypes.POINTER(DynamoArg), ctypes.c_size_t, ctypes.POINTER(P),
                                     ctypes.c_char_p, ctypes.c_size_t]),
        "dynamo_entry_run": (st, [P, ctypes.POINTER(DynamoArg), ctypes.c_size_t, ctypes.POINTER(DLTensor),
                                  ctypes.c_size_t]),
        "dynamo_entry_run_alloc": (st, [P, ctypes.POINTER(DynamoArg), ctypes.c_size_t, ctypes.POINTER(P),
                                        ctypes.c_size_t]),
        "dynamo_frame_run": (st, [P, ctypes.POINTER(DynamoArg), ctypes.c_size_t, ctypes.POINTER(DLTensor),
                                  ctypes.c_size_t]),
        "dynamo_entry_num_outputs": (ctypes.c_size_t, [P]),
        "dynamo_entry_output_info": (st, [P, ctypes.c_size_t, ctypes.POINTER(TensorInfo)]),
        "dynamo_entry_get_stats": (st, [P, ctypes.POINTER(EntryStats)]),
        "dynamo_entry_output_alias": (st, [P, ctypes.c_size_t, ctypes.POINTER(OutputAlias)]),
        "dynamo_take_exit": (st, [ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(P), ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.c_size_t)]),
        "dynamo_entry_num_exits": (ctypes.c_size_t, [P]),
        "dynamo_exit_entry": (P, []),
        "dynamo_entry_link_exit": (st, [P, ctypes.c_int32, P]),
        "dynamo_entry_exit_count": (ctypes.c_int64, [P, ctypes.c_int32]),
        "dynamo_blas_hold": (st, [ctypes.c_int]),
        "dynamo_blas_threads": (ctypes.c_int, []),
        "dynamo_entry_choices": (st, [P, ctypes.POINTER(P)]),
        "dynamo_entry_set_choices": (st, [P, ctypes.c_char_p]),
        "dynamo_entry_profile": (st, [P, ctypes.POINTER(P)]),
        "dynamo_cache_directory": (st, [ctypes.POINTER(P)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
