// What cuteforge's two C++ paths share: dtype names and DLPack codes, TVM-FFI errors as
// C++ exceptions, and a compiled kernel's call on torch's current stream.
#pragma once

#include <torch/extension.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <stdexcept>
#include <string>

namespace cuteforge_native {

inline at::ScalarType scalar_type(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "int64") return at::kLong;
  if (name == "int32") return at::kInt;
  throw std::invalid_argument("cuteforge native: unsupported dtype " + name);
}

// t's DLPack dtype in `out`; false for a dtype without one here.
inline bool find_dl_dtype(at::ScalarType t, DLDataType& out) {
  switch (t) {
    case at::kFloat: out = {kDLFloat, 32, 1}; return true;
    case at::kDouble: out = {kDLFloat, 64, 1}; return true;
    case at::kHalf: out = {kDLFloat, 16, 1}; return true;
    case at::kBFloat16: out = {kDLBfloat, 16, 1}; return true;
    case at::kFloat8_e4m3fn: out = {kDLFloat8_e4m3fn, 8, 1}; return true;
    case at::kFloat8_e5m2: out = {kDLFloat8_e5m2, 8, 1}; return true;
    case at::kLong: out = {kDLInt, 64, 1}; return true;
    case at::kInt: out = {kDLInt, 32, 1}; return true;
    case at::kShort: out = {kDLInt, 16, 1}; return true;
    case at::kChar: out = {kDLInt, 8, 1}; return true;
    case at::kByte: out = {kDLUInt, 8, 1}; return true;
    case at::kBool: out = {kDLBool, 8, 1}; return true;
    default: return false;
  }
}

inline DLDataType dl_dtype(at::ScalarType t) {
  DLDataType d;
  if (!find_dl_dtype(t, d)) throw std::invalid_argument("cuteforge native: no DLPack dtype for this tensor");
  return d;
}

inline DLDevice dl_device(const at::Device& d) {
  return DLDevice{d.is_cuda() ? kDLCUDA : kDLCPU, d.is_cuda() ? d.index() : 0};
}

// The error a failed TVM-FFI call raised, taken from TVM-FFI's error slot: its kind
// ("ValueError", ...) and message; false where there is none.
inline bool take_ffi_error(std::string& kind, std::string& message) {
  TVMFFIObjectHandle err = nullptr;
  TVMFFIErrorMoveFromRaised(&err);
  if (!err) return false;
  TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(err);
  kind.assign(cell->kind.data, cell->kind.size);
  message.assign(cell->message.data, cell->message.size);
  TVMFFIObjectDecRef(err);
  return true;
}

[[noreturn]] inline void raise_ffi_error(const std::string& where) {
  std::string kind, message, msg = where + ": the kernel call failed";
  if (take_ffi_error(kind, message)) msg += " (" + kind + ": " + message + ")";
  throw std::runtime_error(msg);
}

// Call `fn` with `n` packed arguments, its return in `result` (the caller's to release);
// non-zero when the call failed (the error is in TVM-FFI's slot: take_ffi_error). On CUDA
// the compiled kernels launch on TVM-FFI's environment stream: it is made torch's current
// stream for `device` during the call and put back after, as TVM-FFI's Python binding
// does for torch tensors.
inline int call_on_current_stream_status(TVMFFIObjectHandle fn, TVMFFIAny* any, int32_t n, const at::Device& device,
                                         TVMFFIAny* result) {
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  if (!device.is_cuda()) return TVMFFIFunctionCall(fn, any, n, result);
  void* stream = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(device).native_handle();
  TVMFFIStreamHandle previous = nullptr;
  if (TVMFFIEnvSetStream(kDLCUDA, device.index(), stream, &previous) != 0) return -1;
  int rc = TVMFFIFunctionCall(fn, any, n, result);
  TVMFFIEnvSetStream(kDLCUDA, device.index(), previous, nullptr);
  return rc;
}

// call_on_current_stream_status for a kernel: its return dropped, a failure raised as
// std::runtime_error naming `where`.
inline void call_on_current_stream(TVMFFIObjectHandle fn, TVMFFIAny* any, int32_t n, const at::Device& device,
                                   const std::string& where) {
  TVMFFIAny result;
  if (call_on_current_stream_status(fn, any, n, device, &result) != 0) raise_ffi_error(where);
  if (result.type_index >= kTVMFFIStaticObjectBegin && result.v_obj) TVMFFIObjectDecRef(result.v_obj);
}

// A DLTensor over `t`'s memory from element `offset`, read as (sizes, strides).
inline void fill_dltensor(DLTensor& dl, TVMFFIAny& any, const at::Tensor& t, const std::vector<int64_t>& sizes,
                          const std::vector<int64_t>& strides, int64_t offset, const DLDevice& dev) {
  dl.data = static_cast<char*>(t.data_ptr()) + offset * t.element_size();
  dl.device = dev;
  dl.ndim = static_cast<int32_t>(sizes.size());
  dl.dtype = dl_dtype(t.scalar_type());
  dl.shape = const_cast<int64_t*>(sizes.data());
  dl.strides = const_cast<int64_t*>(strides.data());
  dl.byte_offset = 0;
  any.type_index = kTVMFFIDLTensorPtr;
  any.zero_padding = 0;
  any.v_ptr = &dl;
}

}  // namespace cuteforge_native
