// vramledger._C: the Python face of libvramledger_torch's C API (abi/vramledger_c_api.h).
// Plain CPython API: nothing here touches torch objects, so the module does not depend on the
// pybind11 version torch was built with. The package's __init__ imports torch first, which loads
// the libc10 / libcudart this library links against.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>

#include <string>

#include "abi/vramledger_c_api.h"

namespace {

PyObject* raise_last_error() {
  PyErr_SetString(PyExc_RuntimeError, vramledger_last_error());
  return nullptr;
}

// Calls a (buffer, capacity) C function twice: once for the length, once to fill.
template <typename Fill>
PyObject* string_from(Fill fill) {
  std::string text;
  std::size_t length = 0;
  Py_BEGIN_ALLOW_THREADS
  length = fill(nullptr, 0);
  text.resize(length + 1);
  fill(text.data(), text.size());
  Py_END_ALLOW_THREADS
  text.resize(length);
  return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

PyObject* install(PyObject*, PyObject* args) {
  const char* conf = "";
  if (!PyArg_ParseTuple(args, "|s", &conf)) return nullptr;
  if (vramledger_install(conf) != 0) return raise_last_error();
  Py_RETURN_NONE;
}

PyObject* is_installed(PyObject*, PyObject*) { return PyBool_FromLong(vramledger_is_installed()); }

PyObject* stats_json(PyObject*, PyObject* args) {
  int device = -1;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  return string_from([device](char* buffer, std::size_t capacity) {
    return vramledger_stats_json(device, buffer, capacity);
  });
}

PyObject* report(PyObject*, PyObject*) {
  return string_from(
      [](char* buffer, std::size_t capacity) { return vramledger_report(buffer, capacity); });
}

PyObject* process_report(PyObject*, PyObject* args) {
  int device = 0;
  const char* format = "text";
  if (!PyArg_ParseTuple(args, "i|s", &device, &format)) return nullptr;
  std::string text;
  bool ok = false;
  Py_BEGIN_ALLOW_THREADS
  // The result is owned by this thread until its next call: copied before the GIL is retaken.
  if (const char* result = vramledger_process_report(device, format)) {
    text = result;
    ok = true;
  }
  Py_END_ALLOW_THREADS
  if (!ok) return raise_last_error();
  return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

PyObject* empty_cache(PyObject*, PyObject*) {
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS
  rc = vramledger_empty_cache();
  Py_END_ALLOW_THREADS
  if (rc != 0) return raise_last_error();
  Py_RETURN_NONE;
}

PyObject* reset_peak_stats(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  vramledger_reset_peak_stats(device);
  Py_RETURN_NONE;
}

PyObject* reset_accumulated_stats(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  vramledger_reset_accumulated_stats(device);
  Py_RETURN_NONE;
}

PyObject* tag_push(PyObject*, PyObject* args) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  if (vramledger_tag_push(name) != 0) return raise_last_error();
  Py_RETURN_NONE;
}

PyObject* tag_pop(PyObject*, PyObject*) {
  vramledger_tag_pop();
  Py_RETURN_NONE;
}

// Where libvramledger_torch.so lives: CUDAPluggableAllocator and LD_PRELOAD users need the path.
PyObject* library_path(PyObject*, PyObject*) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&vramledger_install), &info) == 0 || info.dli_fname == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "vramledger: cannot locate libvramledger_torch.so");
    return nullptr;
  }
  return PyUnicode_FromString(info.dli_fname);
}

PyMethodDef methods[] = {
    {"install", install, METH_VARARGS, "install(conf='') -> None"},
    {"is_installed", is_installed, METH_NOARGS, "is_installed() -> bool"},
    {"stats_json", stats_json, METH_VARARGS, "stats_json(device) -> str (device -1: all)"},
    {"report", report, METH_NOARGS, "report() -> str"},
    {"process_report", process_report, METH_VARARGS,
     "process_report(device, format='text') -> str (text or json)"},
    {"empty_cache", empty_cache, METH_NOARGS, "empty_cache() -> None"},
    {"reset_peak_stats", reset_peak_stats, METH_VARARGS, "reset_peak_stats(device) -> None"},
    {"reset_accumulated_stats", reset_accumulated_stats, METH_VARARGS,
     "reset_accumulated_stats(device) -> None"},
    {"tag_push", tag_push, METH_VARARGS, "tag_push(name) -> None"},
    {"tag_pop", tag_pop, METH_NOARGS, "tag_pop() -> None"},
    {"library_path", library_path, METH_NOARGS, "library_path() -> str"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "vramledger._C", "libvramledger_torch's C API", -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
