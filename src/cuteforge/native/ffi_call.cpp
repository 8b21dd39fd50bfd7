// A compiled kernel's TVM-FFI function called from Python with torch tensors and scalars,
// without tvm-ffi's Python package: how `kernel_library.LinkedKernel` is called from
// Python (an op's Python launch, a user kernel) where the extension is loaded, so that a
// process's first such call does not import `tvm_ffi`.
//
// call_function(handle, *args) packs each argument as TVM-FFI's Python binding does for
// it: a plain strided torch tensor on the CPU or a CUDA device as a DLTensor over its
// memory (its own sizes and strides), None, bool, int (int64) and float as themselves; it
// calls on torch's current stream of the first CUDA tensor's device (launch plans do the
// same, ffi_launch.cpp). Anything else (another kind of tensor or object, an int beyond
// int64, a dtype without a DLPack code here) returns NotImplemented before any call: the
// caller calls through `tvm_ffi` instead. An error the function raises comes back as the
// Python exception of its kind (ValueError, TypeError, ...; else RuntimeError), as through
// `tvm_ffi`.

#include "launch_plan.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

namespace py = pybind11;

namespace cuteforge_native {
namespace {

PyObject* exception_of(const std::string& kind) {
  if (kind == "ValueError") return PyExc_ValueError;
  if (kind == "TypeError") return PyExc_TypeError;
  if (kind == "IndexError") return PyExc_IndexError;
  if (kind == "KeyError") return PyExc_KeyError;
  if (kind == "AttributeError") return PyExc_AttributeError;
  if (kind == "NotImplementedError") return PyExc_NotImplementedError;
  if (kind == "AssertionError") return PyExc_AssertionError;
  if (kind == "MemoryError") return PyExc_MemoryError;
  return PyExc_RuntimeError;
}

// Pack argument `o` into `any` (a tensor's DLTensor in `dl`); the first CUDA tensor's device
// into `device`. False for an argument this call does not pack.
bool pack(PyObject* o, TVMFFIAny& any, DLTensor& dl, at::Device& device) {
  any.zero_padding = 0;
  any.v_int64 = 0;
  if (o == Py_None) {
    any.type_index = kTVMFFINone;
    return true;
  }
  if (PyBool_Check(o)) {
    any.type_index = kTVMFFIBool;
    any.v_int64 = o == Py_True;
    return true;
  }
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    any.type_index = kTVMFFIInt;
    any.v_int64 = v;
    return true;
  }
  if (PyFloat_CheckExact(o)) {
    any.type_index = kTVMFFIFloat;
    any.v_float64 = PyFloat_AS_DOUBLE(o);
    return true;
  }
  // torch.Tensor and nn.Parameter with their own strided memory (no subclass, no Python
  // dispatch, no functionalized or wrapped tensor, no lazy negation or conjugation)
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (t.layout() != at::kStrided || !t.has_storage() || t.key_set().has_any(kNotPlain) || !(t.is_cpu() || t.is_cuda()))
    return false;
  DLDataType dtype;
  if (!find_dl_dtype(t.scalar_type(), dtype)) return false;
  dl.data = t.data_ptr();
  dl.device = dl_device(t.device());
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = dtype;
  dl.shape = const_cast<int64_t*>(t.sizes().data());
  dl.strides = const_cast<int64_t*>(t.strides().data());
  dl.byte_offset = 0;
  any.type_index = kTVMFFIDLTensorPtr;
  any.v_ptr = &dl;
  if (t.is_cuda() && !device.is_cuda()) device = t.device();
  return true;
}

// The function's return as a Python value (None, bool, int, float: what kernels return).
PyObject* to_python(const TVMFFIAny& r) {
  switch (r.type_index) {
    case kTVMFFINone: Py_RETURN_NONE;
    case kTVMFFIBool: return PyBool_FromLong(r.v_int64 != 0);
    case kTVMFFIInt: return PyLong_FromLongLong(r.v_int64);
    case kTVMFFIFloat: return PyFloat_FromDouble(r.v_float64);
    default: break;
  }
  if (r.type_index >= kTVMFFIStaticObjectBegin && r.v_obj) TVMFFIObjectDecRef(r.v_obj);
  PyErr_Format(PyExc_TypeError, "call_function: the function returned a value of TVM-FFI type index %d, which only "
               "tvm_ffi converts", static_cast<int>(r.type_index));
  return nullptr;
}

// call_function(handle, *args) -> the function's return, or NotImplemented (see above)
// (METH_FASTCALL: no argument tuple on the warm path).
PyObject* call_function(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  if (argc < 1) {
    PyErr_SetString(PyExc_TypeError, "call_function(handle, *args): missing the function handle");
    return nullptr;
  }
  void* fn = PyLong_AsVoidPtr(argv[0]);
  if (!fn) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "call_function: a null function handle");
    return nullptr;
  }
  const size_t n = static_cast<size_t>(argc - 1);
  c10::SmallVector<TVMFFIAny, kMaxTensors> any(n);
  c10::SmallVector<DLTensor, kMaxTensors> dl(n);
  at::Device device(at::kCPU);
  for (size_t i = 0; i < n; ++i) {
    if (!pack(argv[i + 1], any[i], dl[i], device)) Py_RETURN_NOTIMPLEMENTED;
  }
  // the GIL stays held: the call is a launch, microseconds
  TVMFFIAny result;
  if (call_on_current_stream_status(static_cast<TVMFFIObjectHandle>(fn), any.data(), static_cast<int32_t>(n), device,
                                    &result) != 0) {
    std::string kind = "RuntimeError", message = "the kernel call failed";
    take_ffi_error(kind, message);
    PyErr_SetString(exception_of(kind), message.c_str());
    return nullptr;
  }
  return to_python(result);
  END_HANDLE_TH_ERRORS
}

PyMethodDef call_function_def = {
    "call_function", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&call_function)), METH_FASTCALL,
    "call_function(handle, *args): call a TVM-FFI function handle with torch tensors and scalars on torch's current "
    "stream; NotImplemented for arguments it does not pack"};

}  // namespace

void register_call(py::module_& m) {
  PyObject* f = PyCFunction_NewEx(&call_function_def, nullptr, m.attr("__name__").ptr());
  if (!f) throw py::error_already_set();
  m.add_object(call_function_def.ml_name, py::reinterpret_steal<py::object>(f));
}

}  // namespace cuteforge_native
