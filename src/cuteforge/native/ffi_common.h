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

inline DLDataType dl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kDouble: return {kDLFloat, 64, 1};
    case at::kHalf: return {kDLFloat, 16, 1};
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    case at::kLong: return {kDLInt, 64, 1};
    case at::kInt: return {kDLInt, 32, 1};
    default: throw std::invalid_argument("cuteforge native: no DLPack dtype for this tensor");
  }
}

inline DLDevice dl_device(const at::Device& d) {
  return DLDevice{d.is_cuda() ? kDLCUDA : kDLCPU, d.is_cuda() ? d.index() : 0};
}

[[noreturn]] inline void raise_ffi_error(const std::string& where) {
  TVMFFIObjectHandle err = nullptr;
  TVMFFIErrorMoveFromRaised(&err);
  std::string msg = where + ": the kernel call failed";
  if (err) {
    TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(err);
    msg += std::string(" (") + std::string(cell->kind.data, cell->kind.size) + ": " +
           std::string(cell->message.data, cell->message.size) + ")";
    TVMFFIObjectDecRef(err);
  }
  throw std::runtime_error(msg);
}

// Call `fn` with `n` packed arguments. On CUDA the compiled kernels launch on TVM-FFI's
// environment stream: it is made torch's current stream for `device` during the call and
// put back after, as TVM-FFI's Python binding does for torch tensors.
inline void call_on_current_stream(TVMFFIObjectHandle fn, TVMFFIAny* any, int32_t n, const at::Device& device,
                                   const std::string& where) {
  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  int rc;
  if (device.is_cuda()) {
    void* stream = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(device).native_handle();
    TVMFFIStreamHandle previous = nullptr;
    if (TVMFFIEnvSetStream(kDLCUDA, device.index(), stream, &previous) != 0) raise_ffi_error(where);
    rc = TVMFFIFunctionCall(fn, any, n, &result);
    TVMFFIEnvSetStream(kDLCUDA, device.index(), previous, nullptr);
  } else {
    rc = TVMFFIFunctionCall(fn, any, n, &result);
  }
  if (rc != 0) raise_ffi_error(where);
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
