"""Why a recording ends without a trace: the abort reasons, one table (as LuaJIT keeps its trace
errors in lj_traceerr.h). Every abort carries one of these kinds beside its message (the message
says the particulars: which op, which dtype, where); `dynamo.counters()` counts aborts per kind
as `abort_<kind>`, and the kind decides what the front end does next:

  * "retry" kinds may go away on another call (other values, another path): the recording
    backs off and is tried again, up to config.abort_limit;
  * "same" kinds fail the same way for calls that look the same: two in a row at the same
    place leave the function to CPython at once (the back-off would only repeat the recording);
  * "state" kinds depend on state another call may not have (grad mode and requires_grad; the
    dtype, device or layout of its tensors): they do not count toward the abort limit; the
    function runs eagerly while that state holds (a module's parts compiled apart meanwhile), and
    is recorded again in another state (backoff.Policy.state_aborted); for autograd the user
    is told once how to get a compiled call.

This module is a leaf: the recorder, the interpreter and the front end import it.
"""

# kind: (policy, what it means)
KINDS = {
    "dtype": ("state", "a tensor dtype the compiler has no type for (complex, quantized), or a complex number"),
    "device": ("state", "tensors on a device dynamo does not compile for, or on several devices in one call"),
    "layout": ("state", "a sparse or other non-strided tensor, or a layout, memory format or pinned memory "
                       "an op asks for"),
    "autograd": ("state", "grad mode is on and a tensor requires grad where training.py cannot compile the call "
                          "(ops whose output size depends on the data, writes into inputs that require grad, "
                          "a call of fewer than 4 ops, ...), or the call leaves "
                          "grad mode changed"),
    "unknown_tensor": ("same", "a tensor made by code that was not recorded reached a recorded op"),
    "op_arguments": ("same", "an ATen op whose arguments, overload or variant the IR cannot express"),
    "strided_view": ("same", "a view with stride arguments over memory whose layout the compiler chooses"),
    "data_dependent": ("retry", "a value or an output size depends on tensor contents where no side exit "
                                "can be placed"),
    "write": ("same", "an in-place write the trace cannot carry (into a tensor of unknown origin, through "
                      "a view the IR records as a copy, into an aliased input)"),
    "python": ("same", "Python the interpreter does not record: a construct, a closure assignment, a "
                       "container changed from outside, an import of a module not loaded"),
    "too_long": ("same", "the trace grew past a limit (bytecodes, IR instructions with no place to cut)"),
    "result": ("same", "the call returns something a trace cannot give back (an object, an unrecorded "
                       "tensor, a generator)"),
    "nothing": ("retry", "no tensor operations on this path: nothing to compile"),
    "continuation": ("retry", "the trace after a stitch or side exit cannot be recorded, or none of them "
                              "fits the calls"),
    "native_run": ("retry", "a native run failed (the trace is dropped; eager answered the call)"),
    "internal": ("retry", "dynamo failed inside: recording, compiling or resuming raised"),
}

COUNTERS = tuple(f"abort_{k}" for k in KINDS)


def policy(kind):
    """"retry", "same" or "state" for an abort kind (unknown kinds retry)."""
    return KINDS.get(kind, ("retry", ""))[0]
