// _fastcall.cpp -- the front end's hot path in one native call: torch tensors and Python
// scalars in, dynamo_entry_run_alloc, torch tensors out. The ctypes route (native.make_args)
// builds a DLTensor per tensor in Python and costs ~20 us per call; this costs ~1 us.
//
//   run(entry, inputs, nout) -> tuple of outputs | None (native guard miss) | int (error status;
//                               the message is dynamo_last_error() on this thread)
// entry is the dynamo_entry handle as an int; inputs a list or tuple of tensors, bools, ints
// and floats in trace-input order. An output that aliases an input comes back as None (the
// caller makes the view). Tensors are borrowed for the call only; outputs own engine buffers
// (released to the engine's pool when the tensor dies).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "dynamo.h"

namespace {

constexpr uint8_t kDynamoDLBool = 6;  // the C API's code for bool (DLPack >= 0.8's kDLBool)

bool dl_dtype(at::ScalarType s, DLDataType *out) {
  out->lanes = 1;
  switch (s) {
    case at::kBool: *out = {kDynamoDLBool, 8, 1}; return true;
    case at::kInt: *out = {kDLInt, 32, 1}; return true;
    case at::kLong: *out = {kDLInt, 64, 1}; return true;
    case at::kFloat: *out = {kDLFloat, 32, 1}; return true;
    case at::kDouble: *out = {kDLFloat, 64, 1}; return true;
    case at::kHalf: *out = {kDLFloat, 16, 1}; return true;
    case at::kBFloat16: *out = {kDLBfloat, 16, 1}; return true;
    default: return false;
  }
}

PyObject *wrap_output(DLManagedTensor *m) {
  bool is_bool = m->dl_tensor.dtype.code == kDynamoDLBool;
  if (is_bool) m->dl_tensor.dtype = {kDLUInt, 8, 1};  // ATen 1.13 reads no bool from DLPack
  at::Tensor t = at::fromDLPack(m);                    // takes ownership (calls the deleter)
  if (is_bool) t = t.view(at::kBool);
  return THPVariable_Wrap(std::move(t));
}

PyObject *run(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "run(entry, inputs, nout)");
    return nullptr;
  }
  auto *entry = reinterpret_cast<dynamo_entry *>(PyLong_AsVoidPtr(args[0]));
  Py_ssize_t nout = PyLong_AsSsize_t(args[2]);
  if (PyErr_Occurred()) return nullptr;
  PyObject *seq = PySequence_Fast(args[1], "run: inputs must be a list or tuple");
  if (!seq) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  std::vector<dynamo_arg> argv((size_t)n);
  std::vector<dynamo_versioned_tensor> dls((size_t)n);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject *o = items[k];
    dynamo_arg &a = argv[(size_t)k];
    a = dynamo_arg{};
    if (THPVariable_Check(o)) {
      const at::Tensor &t = THPVariable_Unpack(o);
      DLTensor &d = dls[(size_t)k].tensor;
      if (!dl_dtype(t.scalar_type(), &d.dtype)) {  // (complex, quantized): no trace takes it, a guard miss
        Py_DECREF(seq);
        Py_RETURN_NONE;
      }
      d.data = t.numel() ? t.data_ptr() : nullptr;
      d.device = {t.is_cuda() ? kDLCUDA : kDLCPU, t.is_cuda() ? (int32_t)t.get_device() : 0};
      d.ndim = (int32_t)t.dim();
      d.shape = const_cast<int64_t *>(t.sizes().data());
      d.strides = const_cast<int64_t *>(t.strides().data());
      d.byte_offset = 0;
      a.kind = DYNAMO_ARG_TENSOR;
      a.flags = t.requires_grad() ? DYNAMO_ARG_FLAG_REQUIRES_GRAD : 0;
      if (!t.is_inference()) {  // inference tensors count no writes
        a.flags |= DYNAMO_ARG_FLAG_VERSIONED;
        dls[(size_t)k].version = (uint64_t)t._version();
      }
      a.u.tensor = &d;
    } else if (PyBool_Check(o)) {
      a.kind = DYNAMO_ARG_BOOL;
      a.u.b = o == Py_True;
    } else if (PyLong_Check(o)) {
      a.kind = DYNAMO_ARG_INT;
      a.u.i = PyLong_AsLongLong(o);
      if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return nullptr;
      }
    } else if (PyFloat_Check(o)) {
      a.kind = DYNAMO_ARG_FLOAT;
      a.u.f = PyFloat_AS_DOUBLE(o);
    } else {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "dynamo: cannot pass %s as a trace input", Py_TYPE(o)->tp_name);
      return nullptr;
    }
  }
  std::vector<DLManagedTensor *> outs((size_t)nout, nullptr);
  dynamo_status st;
  Py_BEGIN_ALLOW_THREADS
  st = dynamo_entry_run_alloc(entry, argv.data(), (size_t)n, outs.data(), (size_t)nout);
  Py_END_ALLOW_THREADS
  Py_DECREF(seq);  // the tensors stayed alive: the caller holds the inputs list
  if (st == DYNAMO_ERR_GUARD_MISS) Py_RETURN_NONE;
  if (st != DYNAMO_OK) return PyLong_FromLong((long)st);
  PyObject *tuple = PyTuple_New(nout);
  if (!tuple) return nullptr;
  for (Py_ssize_t k = 0; k < nout; ++k) {
    PyObject *v;
    if (outs[(size_t)k] == nullptr) {
      v = Py_None;
      Py_INCREF(v);
    } else {
      try {
        v = wrap_output(outs[(size_t)k]);
      } catch (const std::exception &e) {
        v = nullptr;
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
      outs[(size_t)k] = nullptr;
      if (!v) {  // release what is left
        for (Py_ssize_t j = k + 1; j < nout; ++j)
          if (outs[(size_t)j]) outs[(size_t)j]->deleter(outs[(size_t)j]);
        Py_DECREF(tuple);
        return nullptr;
      }
    }
    PyTuple_SET_ITEM(tuple, k, v);
  }
  return tuple;
}

// -- module_attr: getattr for the guards' reads of module attributes ----------------------
// A guard function reads a model's submodules and parameters (a[0].layer1, ...conv.weight) on
// every call; through Python's getattr each read fails the ordinary lookup first and then runs
// nn.Module.__getattr__ in Python (~0.5 us; a ViT's guards make ~300 such reads). module_attr(o,
// name) is getattr(o, name) with that __getattr__ done here when o's class inherits
// nn.Module.__getattr__ and object.__getattribute__ unchanged: the ordinary lookup (descriptors,
// the instance dict), then the _parameters, _buffers and _modules dicts in Module.__getattr__'s
// order. Anything else -- another class, a dict of another kind, a name found nowhere -- is
// Python's own getattr, so the result (or the exception) is always getattr's.
PyObject *g_module_getattr = nullptr;      // torch.nn.Module.__getattr__ (set_module_getattr)
PyObject *g_object_getattribute = nullptr;  // object.__getattribute__
PyObject *g_str_getattr = nullptr, *g_str_getattribute = nullptr;
PyObject *g_module_dicts[3] = {};  // "_parameters", "_buffers", "_modules", interned (their lookup order)
PyObject *g_str_forward = nullptr, *g_str_dict = nullptr, *g_hook_names[3] = {};

PyObject *set_module_getattr(PyObject *, PyObject *fn) {
  if (!g_str_getattr) {
    g_str_getattr = PyUnicode_InternFromString("__getattr__");
    g_str_getattribute = PyUnicode_InternFromString("__getattribute__");
    if (!g_str_getattr || !g_str_getattribute) return nullptr;
    g_object_getattribute = _PyType_Lookup(&PyBaseObject_Type, g_str_getattribute);
    Py_XINCREF(g_object_getattribute);
    const char *const dicts[] = {"_parameters", "_buffers", "_modules"};
    const char *const hooks[] = {"_forward_hooks", "_forward_pre_hooks", "_backward_hooks"};
    for (int i = 0; i < 3; ++i) {
      g_module_dicts[i] = PyUnicode_InternFromString(dicts[i]);
      g_hook_names[i] = PyUnicode_InternFromString(hooks[i]);
      if (!g_module_dicts[i] || !g_hook_names[i]) return nullptr;
    }
    g_str_forward = PyUnicode_InternFromString("forward");
    g_str_dict = PyUnicode_InternFromString("__dict__");
    if (!g_str_forward || !g_str_dict) return nullptr;
  }
  Py_XDECREF(g_module_getattr);
  Py_INCREF(fn);
  g_module_getattr = fn;
  Py_RETURN_NONE;
}

PyObject *module_attr(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "module_attr(object, name: str)");
    return nullptr;
  }
  PyObject *obj = args[0], *name = args[1];
  PyTypeObject *tp = Py_TYPE(obj);
  if (!g_module_getattr || !g_object_getattribute || _PyType_Lookup(tp, g_str_getattr) != g_module_getattr ||
      _PyType_Lookup(tp, g_str_getattribute) != g_object_getattribute)
    return PyObject_GetAttr(obj, name);
  PyObject *r = _PyObject_GenericGetAttrWithDict(obj, name, nullptr, 1);  // (suppress: not found is no error)
  if (r || PyErr_Occurred()) return r;
  PyObject *d = PyObject_GenericGetDict(obj, nullptr);
  if (!d) {
    PyErr_Clear();
    return PyObject_GetAttr(obj, name);
  }
  for (PyObject *k : g_module_dicts) {
    PyObject *sub = PyDict_GetItemWithError(d, k);  // borrowed
    if (!sub) {
      if (PyErr_Occurred()) {
        Py_DECREF(d);
        return nullptr;
      }
      continue;
    }
    if (!PyDict_CheckExact(sub)) break;  // (a mapping of another kind: Python's getattr decides)
    PyObject *v = PyDict_GetItemWithError(sub, name);
    if (v) {
      Py_INCREF(v);
      Py_DECREF(d);
      return v;
    }
    if (PyErr_Occurred()) {
      Py_DECREF(d);
      return nullptr;
    }
  }
  Py_DECREF(d);
  return PyObject_GetAttr(obj, name);
}

// -- plain_call: a module call's guard ---------------------------------------------------------
// plain_call(m, forward, runs_class_forward) is the value of
//   type(m).forward is forward and not (('forward' in m.__dict__ and not runs_class_forward(m))
//                                       or m._forward_hooks or m._forward_pre_hooks or m._backward_hooks)
// with the same reads in the same order (an exception raised by one propagates, as it would from
// the expression): calling m runs its class's forward, with no hooks. A ViT's guard function
// makes this check once per module call (~260 of them), ~3x faster here than in Python.
PyObject *plain_call(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "plain_call(module, forward, runs_class_forward)");
    return nullptr;
  }
  if (!g_str_forward) {
    PyErr_SetString(PyExc_RuntimeError, "plain_call before set_module_getattr");
    return nullptr;
  }
  PyObject *m = args[0];
  PyObject *f = PyObject_GetAttr((PyObject *)Py_TYPE(m), g_str_forward);
  if (!f) return nullptr;
  bool same = f == args[1];
  Py_DECREF(f);
  if (!same) Py_RETURN_FALSE;
  PyObject *d = PyObject_GetAttr(m, g_str_dict);
  if (!d) return nullptr;
  int has = PySequence_Contains(d, g_str_forward);
  Py_DECREF(d);
  if (has < 0) return nullptr;
  if (has) {
    PyObject *r = PyObject_CallOneArg(args[2], m);
    if (!r) return nullptr;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (t < 0) return nullptr;
    if (!t) Py_RETURN_FALSE;
  }
  for (PyObject *name : g_hook_names) {
    PyObject *v = PyObject_GetAttr(m, name);
    if (!v) return nullptr;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0) return nullptr;
    if (t) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(entry, inputs, nout) -> outputs | None | status"},
    {"module_attr", (PyCFunction)(void (*)(void))module_attr, METH_FASTCALL,
     "module_attr(object, name) -> getattr(object, name), nn.Module's __getattr__ done natively"},
    {"set_module_getattr", set_module_getattr, METH_O, "set_module_getattr(torch.nn.Module.__getattr__)"},
    {"plain_call", (PyCFunction)(void (*)(void))plain_call, METH_FASTCALL,
     "plain_call(module, forward, runs_class_forward) -> whether calling module runs that forward, with no hooks"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall", "dynamo's per-call hot path.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall(void) { return PyModule_Create(&module); }
