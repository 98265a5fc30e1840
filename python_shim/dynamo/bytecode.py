"""CPython's bytecode as the recording interpreter reads it: each version's encoding decoded, in
this one place, into one vocabulary that the interpreter's handlers (and sizeflow's) are written
against.

The vocabulary is CPython 3.11's instruction set (`dis.Instruction`s, offsets and exception
table unchanged), plus a few operations later versions added that have no 3.11 spelling; a
handler is written once for each. What a decoder does per version:

3.12
- `LOAD_ATTR` with its low bit set (a method load) is 3.11's `LOAD_METHOD`.
- `POP_JUMP_IF_{TRUE,FALSE,NONE,NOT_NONE}` (either direction) are the 3.11 forward forms (the
  target is an offset in both).
- `FOR_ITER` and `SEND` jump past the `END_FOR` / `END_SEND` that closes their loop, as CPython
  itself does when the iterator ends (3.11's behaviour: the iterator is popped, or replaced by
  the return value, at the jump).
- `COMPARE_OP`'s argument is the index into `dis.cmp_op` (3.12 shifts it by 4, 3.13 by 5 with a
  to-bool flag, which the branch that follows applies anyway).
- `LOAD_FAST_CHECK` is `LOAD_FAST` (whose handler checks for an unbound local in every version).
- `CALL_INTRINSIC_2` of `PREP_RERAISE_STAR` (except*) is that 3.11 instruction;
  `CALL_INTRINSIC_1` of `UNARY_POSITIVE` / `LIST_TO_TUPLE` are those 3.11 instructions;
  `INTRINSIC_STOPITERATION_ERROR` (PEP 479 in a generator's own bytecode) stays itself; the
  other intrinsics (import *, type parameters) are named by their intrinsic so they show up as
  unsupported by name.
- New operations kept under their own names: `RETURN_CONST`, `BINARY_SLICE`, `STORE_SLICE`,
  `LOAD_FAST_AND_CLEAR` (PEP 709's inlined comprehensions), `LOAD_SUPER_ATTR` (its method flag
  and the two-argument form read from `arg`), `END_FOR`, `END_SEND`, `CLEANUP_THROW`.

3.13, on top of 3.12
- `PUSH_NULL` comes after the callable (3.13's stack order is callable, then NULL); it becomes
  `PUSH_NULL_BELOW`, which puts the NULL under the callable: the interpreter's stacks keep 3.11's
  order throughout (`LOAD_GLOBAL` / `LOAD_ATTR` handlers push NULL first already).
- `MAKE_FUNCTION` followed by its `SET_FUNCTION_ATTRIBUTE`s is one 3.11 `MAKE_FUNCTION` whose
  flags are theirs (the attributes lie on the stack as 3.11's MAKE_FUNCTION pops them); the
  `SET_FUNCTION_ATTRIBUTE`s become `NOP`s.
- `TO_BOOL` is a `NOP`: each consumer of its result (a conditional jump, `UNARY_NOT`) takes the
  truth value itself, as 3.11's did.
- `CALL_KW` (keyword names as a tuple on the stack), `LOAD_FAST_LOAD_FAST`,
  `STORE_FAST_LOAD_FAST`, `STORE_FAST_STORE_FAST` (two locals in one argument),
  `CONVERT_VALUE`, `FORMAT_SIMPLE`, `FORMAT_WITH_SPEC` (3.11's FORMAT_VALUE in parts) are kept
  under their names.

`decode(code)` returns the instructions (no CACHE entries) and `exception_table(code)` the
protected ranges; both are cached per code object by the interpreter (`_Code`)."""
import dis
import sys

VERSION = sys.version_info[:2]
SUPPORTED_VERSIONS = ((3, 11), (3, 12), (3, 13))

_CMP = list(dis.cmp_op)
# the message of a class pattern's TypeError, as this version words it
MATCH_NOT_A_CLASS = "called match pattern must be a " + ("type" if VERSION == (3, 11) else "class")
# CALL_INTRINSIC_1's operands (Include/internal/pycore_intrinsics.h)
_INTRINSIC_1 = {1: "PRINT", 2: "IMPORT_STAR", 3: "STOPITERATION_ERROR", 4: "ASYNC_GEN_WRAP", 5: "UNARY_POSITIVE",
                6: "LIST_TO_TUPLE", 7: "TYPEVAR", 8: "PARAMSPEC", 9: "TYPEVARTUPLE", 10: "SUBSCRIPT_GENERIC",
                11: "TYPEALIAS"}
_POP_JUMPS = {"POP_JUMP_IF_TRUE": "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_IF_FALSE": "POP_JUMP_FORWARD_IF_FALSE",
              "POP_JUMP_IF_NONE": "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_IF_NOT_NONE": "POP_JUMP_FORWARD_IF_NOT_NONE"}


# Names the interpreter's handlers answer to that are no opcode of the running version: 3.11's
# (what later versions decode into) and the decoders' own.
VOCABULARY_311 = frozenset((
    "LOAD_METHOD", "PRECALL", "KW_NAMES", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE",
    "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE",
    "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP", "LIST_TO_TUPLE", "UNARY_POSITIVE", "FORMAT_VALUE",
    "BUILD_CONST_KEY_MAP", "PREP_RERAISE_STAR"))
OWN_NAMES = frozenset(("PUSH_NULL_BELOW",))
# ... and the opcodes 3.12 and 3.13 added that have handlers (not in 3.11's dis.opmap)
LATER_NAMES = frozenset((
    "RETURN_CONST", "BINARY_SLICE", "STORE_SLICE", "LOAD_FAST_AND_CLEAR", "LOAD_SUPER_ATTR", "END_FOR", "END_SEND",
    "CLEANUP_THROW", "CALL_INTRINSIC_1", "CALL_KW", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
    "STORE_FAST_STORE_FAST", "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC"))


def decode(code):
    """code's instructions in the interpreter's vocabulary (see the module's text)."""
    insts = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    if VERSION == (3, 11):
        return insts
    return _decode_312_313(insts)


def exception_table(code):
    """(start, end, target, depth, lasti) per protected range: byte offsets, end exclusive,
    innermost ranges first."""
    return [(e.start, e.end, e.target, e.depth, e.lasti) for e in dis._parse_exception_table(code)]


def _past(insts, index, offset, *closers):
    """The offset of the instruction after the closers that start at `offset` (END_FOR, then
    3.13's POP_TOP; END_SEND): where CPython goes on when the loop's iterator ends."""
    k = index[offset]
    for name in closers:
        if k < len(insts) and insts[k].opname == name:
            k += 1
    return insts[k].offset if k < len(insts) else offset


def _decode_312_313(insts):
    new313 = VERSION >= (3, 13)
    index = {ins.offset: k for k, ins in enumerate(insts)}
    out = []
    for k, ins in enumerate(insts):
        op = ins.opname
        if op == "LOAD_ATTR" and ins.arg & 1:
            ins = ins._replace(opname="LOAD_METHOD")
        elif op in _POP_JUMPS:
            ins = ins._replace(opname=_POP_JUMPS[op])
        elif op == "FOR_ITER":
            closers = ("END_FOR", "POP_TOP") if new313 else ("END_FOR",)
            ins = ins._replace(argval=_past(insts, index, ins.argval, *closers))
        elif op == "SEND":
            ins = ins._replace(argval=_past(insts, index, ins.argval, "END_SEND"))
        elif op == "COMPARE_OP":
            ins = ins._replace(arg=_CMP.index(ins.argval))
        elif op == "LOAD_FAST_CHECK":
            ins = ins._replace(opname="LOAD_FAST")
        elif op == "CALL_INTRINSIC_1":
            name = _INTRINSIC_1.get(ins.arg, str(ins.arg))
            if name in ("UNARY_POSITIVE", "LIST_TO_TUPLE"):
                ins = ins._replace(opname=name)
            elif name != "STOPITERATION_ERROR":
                ins = ins._replace(opname=f"CALL_INTRINSIC_1 ({name})")
        elif op == "CALL_INTRINSIC_2":  # PREP_RERAISE_STAR (except*) was an opcode of its own in 3.11
            ins = ins._replace(opname="PREP_RERAISE_STAR" if ins.arg == 1 else f"CALL_INTRINSIC_2 ({ins.arg})")
        elif op == "END_FOR":  # (not reached: FOR_ITER jumps past it) what it pops
            ins = ins._replace(arg=1 if new313 else 2)
        elif new313 and op == "PUSH_NULL":
            ins = ins._replace(opname="PUSH_NULL_BELOW")
        elif new313 and op == "TO_BOOL":
            ins = ins._replace(opname="NOP")
        elif new313 and op == "MAKE_FUNCTION":
            flags, j = 0, k + 1
            while j < len(insts) and insts[j].opname == "SET_FUNCTION_ATTRIBUTE":
                flags |= insts[j].arg
                j += 1
            ins = ins._replace(arg=flags)
        elif new313 and op == "SET_FUNCTION_ATTRIBUTE":
            ins = ins._replace(opname="NOP")
        out.append(ins)
    return out


def opcodes_seen(code, seen=None):
    """The decoded opnames of code and of every code object nested in it (a test lists them per
    version against the interpreter's handlers)."""
    seen = set() if seen is None else seen
    seen.update(i.opname for i in decode(code))
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            opcodes_seen(c, seen)
    return seen
