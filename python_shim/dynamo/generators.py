"""The recording interpreter's generators (interpreter.py): a generator function called in a
recorded call makes a _Generator, whose frame the interpreter runs lazily, as CPython runs a
generator's; it looks like a generator to the program (type(), isinstance(), send/throw/close,
PEP 479), is closed when its last reference goes (its finally runs there, recorded), and leaves
the call as a real generator that delegates to it (_realize). Also the two exception-table facts
the interpreter and these share: which handlers only restore locals before re-raising."""
import types
import weakref

# what a handler that only restores locals before re-raising runs (Code.catches_at)
_CLEANUP_OPS = frozenset(("SWAP", "POP_TOP", "STORE_FAST", "NOP"))
# ... and a generator's PEP 479 handler (3.12+): closing the generator runs neither
_CLOSE_RUNS_NOTHING = _CLEANUP_OPS | {"CALL_INTRINSIC_1"}


_HOLDERS = (list, dict, set, tuple)  # what a dropped local may hold a generator in (_let_go)


def _realize(v, depth=0):
    """v with each interpreted generator in it (also inside lists, tuples and dicts) replaced by
    a real generator that delegates to it (next, send, throw and close pass through `yield
    from`), one per generator: for code outside the call, which sees CPython's type."""
    if isinstance(v, _Generator):
        real = v.real() if v.real is not None else None
        if real is None:
            real = _delegate(v)
            v.real = weakref.ref(real)  # (weak: the delegate holds v, and dropping it must drop v)
        return real
    if depth < 4 and type(v) is tuple:
        return tuple(_realize(e, depth + 1) for e in v)
    if depth < 4 and type(v) is list:
        v[:] = [_realize(e, depth + 1) for e in v]
    elif depth < 4 and type(v) is dict:
        for k in v:
            v[k] = _realize(v[k], depth + 1)
    return v


def _delegate(g):
    return (yield from g)


def _holds_generator(v, depth=0):
    if isinstance(v, _Generator):
        return True
    if depth < 4 and type(v) in (list, tuple, set, frozenset):
        return any(_holds_generator(e, depth + 1) for e in v)
    if depth < 4 and isinstance(v, dict):
        return any(_holds_generator(e, depth + 1) for e in v.values())
    return False


class _Returned(tuple):
    """A generator frame's return (value, source) pair, carried by its StopIteration."""

    __slots__ = ()


class _Yielded:
    """What a generator frame's run returns at YIELD_VALUE: the (value, source) pair."""

    __slots__ = ("pair",)

    def __init__(self, pair):
        self.pair = pair


def _suspended_in_block(f):
    """Generator frame f is suspended at a yield inside a try or with block (closing it runs code)."""
    return bool(f.dec.handlers) and f.dec.catches_at(f.dec.insts[f.ip - 1].offset, cleanup=_CLOSE_RUNS_NOTHING)


def _plain_stop(step, *args):
    """step(*args), a generator's step for the program: the StopIteration at its end carries the
    return value itself (inside the interpreter it carries the (value, source) pair)."""
    try:
        return step(*args)
    except StopIteration as e:
        if not isinstance(e.value, _Returned):
            raise
        value = e.value[0]
    raise StopIteration(value)  # (outside the handler: no context, as CPython's has none)


class _Generator:
    """A generator whose frame the interpreter runs: each next() resumes it under recording
    (its reads are guarded, its tensor ops recorded), lazily as CPython's would, so that all(),
    any(), zip() and early breaks stop it exactly where eager stops. Iterated by the
    interpreter (FOR_ITER) it hands out (value, source) pairs; by a builtin, plain values.
    throw() and close() raise into the suspended frame as CPython's do; a StopIteration that
    leaves the body becomes RuntimeError (PEP 479); resuming it from itself raises ValueError.
    The program sees it as a generator (type(), isinstance: Interpreter._call_introspection)."""

    __slots__ = ("interp", "frame", "done", "started", "running", "real", "__weakref__")

    def __init__(self, interp, frame):
        self.interp, self.frame, self.done, self.started, self.running = interp, frame, False, False, False
        self.real = None  # a weak reference to the real generator standing for it outside the call (_realize)

    # isinstance(g, types.GeneratorType) and inspect.isgenerator, asked by code that is not interpreted
    __class__ = property(lambda self: types.GeneratorType)

    def __del__(self):
        """The last reference is gone: as CPython closes a generator it collects, closing runs
        the finally or __exit__ it is suspended in, there and then, recorded like any code (an
        exception from it is dropped, as CPython reports and ignores one)."""
        interp = self.interp
        interp.local_objs.discard(id(self))
        if interp.abandoned or interp.probe is not None:  # a recording whose call runs again eagerly, a size probe
            return
        if self.started and not self.done and not self.running and _suspended_in_block(self.frame):
            try:
                self.close()
            except BaseException:  # noqa: BLE001 -- see above
                pass

    def _resume(self, thrown=None, sent=(None, None)):
        if self.running:
            raise ValueError("generator already executing")
        if thrown is None and self.started:
            self.frame.stack.append(sent)  # the value sent in (next(): None)
        self.frame.thrown = thrown
        self.started = True
        self.running = True
        try:
            r = self.interp._run_frame(self.frame)
        except StopIteration as e:  # PEP 479: a StopIteration leaving the body is an error
            self.done = True
            err = RuntimeError("generator raised StopIteration")
            err.__cause__ = e
            raise err
        except BaseException:
            self.done = True
            raise
        finally:
            self.running = False
        if isinstance(r, _Yielded):
            return r.pair
        self.done = True
        raise StopIteration(_Returned(r))  # the frame's (value, source), for `yield from`

    def next_pair(self):
        if self.done:
            raise StopIteration
        return self._resume()

    def throw_pair(self, exc, value=None, tb=None):
        if isinstance(exc, type):  # throw(type[, value[, traceback]]), as contextlib calls it
            exc = value if isinstance(value, exc) else exc() if value is None else exc(value)
        if tb is not None:
            exc = exc.with_traceback(tb)
        if self.done or not self.started:  # raised at once: the body never runs (again)
            self.done = True
            raise exc
        return self._resume(thrown=exc)

    def __iter__(self):
        return self

    def __next__(self):
        return _plain_stop(self.next_pair)[0]

    def send_pair(self, pair):
        if pair[0] is not None and not self.started:
            raise TypeError("can't send non-None value to a just-started generator")
        if self.done:
            raise StopIteration
        return self._resume(sent=pair)

    def send(self, value):
        return _plain_stop(self.send_pair, (value, None))[0]

    def throw(self, exc, value=None, tb=None):
        return _plain_stop(self.throw_pair, exc, value, tb)[0]

    def close(self):
        if self.done or not self.started:
            self.done = True
            return
        try:
            self.throw_pair(GeneratorExit())
        except (GeneratorExit, StopIteration):
            return
        raise RuntimeError("generator ignored GeneratorExit")


# A real generator: what type() and isinstance() answer about an interpreted one (_Generator).
_GENERATOR_LIKE = (lambda: (yield))()
_GENERATOR_LIKE.close()
