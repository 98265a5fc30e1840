/* _evalframe.c -- the PEP 523 frame-evaluation hook behind `with dynamo.optimize():`.
 *
 * While a handler is installed, every new Python frame of this interpreter comes here first
 * (the interpreter then also stops inlining Python-to-Python calls, so each call passes
 * through). Only a thread inside enter() (a `with` block it entered) hands its frames to
 * the handler; other threads' run as before. Frames we never want (generators and coroutines,
 * class bodies and module code,
 * code objects the handler marked with skip(), frames started while the handler itself runs)
 * go straight to CPython's own evaluator. For the others the handler is called as
 *     handler(function, args)
 * with the frame's function and its bound arguments in parameter order (positional, keyword-
 * only, then the *args tuple and the **kwargs dict when the code has them). It returns the
 * call's result, or the SKIP sentinel to have CPython evaluate the frame as usual (calls made
 * from that frame come back here). An exception raised by the handler propagates as the call's.
 *
 * Only the frame's entry state is read; a frame we answer for is never evaluated and is cleared
 * by its caller as usual. This file uses CPython's internal frame layout (Py_BUILD_CORE) of
 * 3.11, 3.12 and 3.13; the FRAME_* macros below are all that differs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "dynamo._evalframe is written for the frame layouts of CPython 3.11, 3.12 and 3.13"
#endif

#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

/* What differs between the versions' _PyInterpreterFrame, in one place: the frame's code
 * object, its function, and whether it has run no instruction yet. */
#if PY_VERSION_HEX >= 0x030D0000 /* 3.13: f_executable, instr_ptr at the first instruction */
#define FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#define FRAME_FUNC(f) ((f)->f_funcobj)
#define FRAME_FRESH(f, code) ((f)->instr_ptr == _PyCode_CODE(code))
#elif PY_VERSION_HEX >= 0x030C0000 /* 3.12: f_funcobj, prev_instr before the first instruction */
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_FUNC(f) ((f)->f_funcobj)
#define FRAME_FRESH(f, code) ((f)->prev_instr == _PyCode_CODE(code) - 1)
#else /* 3.11 */
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_FUNC(f) ((PyObject *)(f)->f_func)
#define FRAME_FRESH(f, code) ((f)->prev_instr == _PyCode_CODE(code) - 1)
#endif

static PyObject *handler = NULL;   /* strong reference, NULL when not installed */
static PyObject *skip_codes = NULL; /* set of code objects never handed to the handler */
static PyObject *skip_sentinel = NULL;
static _Thread_local int in_handler = 0;
static _Thread_local int entered = 0; /* `with` blocks this thread is inside (enter/leave) */

static int wanted(_PyInterpreterFrame *frame, int throwflag) {
  if (handler == NULL || !entered || in_handler || throwflag) return 0;
  if (FRAME_FUNC(frame) == NULL || frame->f_locals != NULL) return 0; /* module code, class bodies */
  if (!PyFunction_Check(FRAME_FUNC(frame))) return 0;
  PyCodeObject *code = FRAME_CODE(frame);
  if (!PyCode_Check(code)) return 0;
  if (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)) return 0;
  if (!FRAME_FRESH(frame, code)) return 0; /* not a fresh frame */
  int skip = PySet_Contains(skip_codes, (PyObject *)code);
  if (skip < 0) {
    PyErr_Clear();
    return 0;
  }
  return !skip;
}

static PyObject *bound_arguments(_PyInterpreterFrame *frame) {
  PyCodeObject *code = FRAME_CODE(frame);
  Py_ssize_t n = code->co_argcount + code->co_kwonlyargcount;
  if (code->co_flags & CO_VARARGS) ++n;
  if (code->co_flags & CO_VARKEYWORDS) ++n;
  PyObject *args = PyTuple_New(n);
  if (args == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *v = frame->localsplus[i];
    if (v == NULL) v = Py_None; /* cannot happen for a bound frame; never hand out NULL */
    Py_INCREF(v);
    PyTuple_SET_ITEM(args, i, v);
  }
  return args;
}

static PyObject *eval_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag) {
  if (!wanted(frame, throwflag)) return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
  PyObject *args = bound_arguments(frame);
  if (args == NULL) return NULL;
  PyObject *h = handler;
  Py_INCREF(h);
  in_handler = 1;
  PyObject *result = PyObject_CallFunctionObjArgs(h, FRAME_FUNC(frame), args, NULL);
  in_handler = 0;
  Py_DECREF(h);
  Py_DECREF(args);
  if (result == skip_sentinel) {
    Py_DECREF(result);
    return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
  }
  return result;
}

static PyObject *set_handler(PyObject *self, PyObject *arg) {
  (void)self;
  if (arg != Py_None && !PyCallable_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "set_handler: expected a callable or None");
    return NULL;
  }
  PyObject *previous = handler; /* our reference passes to the caller */
  PyInterpreterState *interp = PyThreadState_GET()->interp;
  if (arg == Py_None) {
    handler = NULL;
    _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
  } else {
    Py_INCREF(arg);
    handler = arg;
    _PyInterpreterState_SetEvalFrameFunc(interp, eval_frame);
  }
  if (previous == NULL) Py_RETURN_NONE;
  return previous;
}

static PyObject *skip(PyObject *self, PyObject *code) {
  (void)self;
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "skip: expected a code object");
    return NULL;
  }
  if (PySet_Add(skip_codes, code) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *clear_skips(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  if (PySet_Clear(skip_codes) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *enter(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  ++entered;
  Py_RETURN_NONE;
}

static PyObject *leave(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  if (entered > 0) --entered;
  Py_RETURN_NONE;
}

static PyObject *get_handler(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *h = handler ? handler : Py_None;
  Py_INCREF(h);
  return h;
}

static PyMethodDef methods[] = {
    {"set_handler", set_handler, METH_O, "set_handler(callable or None) -> previous handler or None"},
    {"get_handler", get_handler, METH_NOARGS, "the installed handler, or None"},
    {"enter", enter, METH_NOARGS, "enter(): this thread's new frames go to the handler (nests)"},
    {"leave", leave, METH_NOARGS, "leave(): undoes one enter() of this thread"},
    {"skip", skip, METH_O, "skip(code): frames of this code object always run in CPython"},
    {"clear_skips", clear_skips, METH_NOARGS, "forget every skip()"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_evalframe",
                                    "PEP 523 frame-evaluation hook for dynamo (CPython 3.11-3.13).", -1, methods};

PyMODINIT_FUNC PyInit__evalframe(void) {
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  skip_codes = PySet_New(NULL);
  skip_sentinel = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (skip_codes == NULL || skip_sentinel == NULL) return NULL;
  Py_INCREF(skip_sentinel);
  if (PyModule_AddObject(m, "SKIP", skip_sentinel) < 0) return NULL;
  return m;
}
