// A launch plan: what one call layout of an op allocates and the steps it runs, in order:
// compiled kernels called with views of its tensors, and matrix products through ATen.
// Shared by the eager launch (ffi_launch.cpp, called from Python) and the dispatcher
// kernels of the registered ops (ffi_dispatch.cpp, called by torch's dispatcher with no
// Python).
#pragma once

#include "ffi_common.h"

#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <vector>

namespace cuteforge_native {

constexpr size_t kMaxTensors = 16;  // inputs, outputs, fixed tensors and kernel arguments, each

// kFixed: a tensor the plan holds (a GEMM's zeroed workspace word, the same for every call)
enum LaunchSource : int { kInput = 0, kOutput = 1, kFixed = 2 };

struct LaunchArg {
  int source;  // LaunchSource
  int index;
  std::vector<int64_t> sizes, strides;
  int64_t offset;  // elements from the tensor's data pointer
};

// One step: a compiled kernel's call (fn: an owned reference, released by the plan; args:
// its operands in order), or a matrix product through ATen's mm (cuBLAS), args (out, a,
// b): out = a @ b, or out += a @ b (a fused linear loss's chunk GEMMs).
enum StepKind : int { kKernel = 0, kMatmul = 1, kMatmulAdd = 2 };

struct PlanStep {
  int kind = kKernel;
  TVMFFIObjectHandle fn = nullptr;
  std::vector<LaunchArg> args;
};

// One returned tensor: an output, or with row >= 0 that row (dim 0) of it (a norm's
// dweight and dbias rows of one (2, N) output).
struct LaunchReturn {
  int index;
  int64_t row;
};

struct LaunchPlan {
  std::string name;
  at::Device device{at::kCPU};
  DLDevice dl_device{kDLCPU, 0};
  size_t n_inputs = 0;
  std::vector<bool> read;  // per input: some argument reads it (else None is accepted)
  std::vector<std::vector<int64_t>> out_sizes;
  std::vector<at::TensorOptions> out_options;
  // on the current stream, in order: the op's kernel, then what finishes its outputs (a
  // norm backward's column sum of its dweight partials), or a fused linear loss's chunks
  std::vector<PlanStep> steps;
  std::vector<at::Tensor> fixed;      // what kFixed arguments name, on `device`
  std::vector<LaunchReturn> returns;  // one returns the tensor, more a tuple

  ~LaunchPlan() {
    for (const PlanStep& s : steps) {
      if (s.fn) TVMFFIObjectDecRef(s.fn);
    }
  }
};

using PlanPtr = std::shared_ptr<const LaunchPlan>;
using Returned = c10::SmallVector<at::Tensor, 4>;

// A call's layout as a table key (the launch tables' and the dispatcher kernels').
using LayoutKey = c10::SmallVector<int64_t, 40>;

struct LayoutKeyHash {
  size_t operator()(const LayoutKey& k) const {
    size_t h = k.size();
    for (int64_t v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

constexpr size_t kMaxPlans = 4096;  // per table; a full table is cleared

// Tensors a plan never reads in place: Python-dispatch subclasses (FakeTensor, DTensor),
// functionalized and functorch-wrapped tensors (no data pointer of their own), and lazy
// negation or conjugation bits.
inline const c10::DispatchKeySet kNotPlain({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                            c10::DispatchKey::Negative, c10::DispatchKey::Conjugate,
                                            c10::DispatchKey::ZeroTensor});

// Append t's layout (dtype, device, sizes, strides, 16-byte alignment of its data) to k;
// false for a tensor no plan reads in place (sparse, without storage, kNotPlain).
inline bool key_tensor(LayoutKey& k, const at::Tensor& t) {
  if (t.layout() != at::kStrided || !t.has_storage() || t.key_set().has_any(kNotPlain) ||
      (t.numel() > 0 && t.data_ptr() == nullptr))
    return false;
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back((static_cast<int64_t>(t.device().type()) << 16) | static_cast<int64_t>(t.device().index() + 1));
  k.push_back(t.dim());
  for (int64_t v : t.sizes()) k.push_back(v);
  for (int64_t v : t.strides()) k.push_back(v);
  k.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15));
  return true;
}

// The plan a capsule from make_launch_plan holds; nullptr with a Python error set if the
// object is no such capsule.
const PlanPtr* plan_ptr_of(PyObject* capsule);

// Allocate p's outputs, run its steps on `in` (p.n_inputs entries, nullptr for an absent
// input that no argument reads), return the tensors it returns. Raises ValueError naming
// the input that is absent but read, or on another device than the plan.
Returned run_plan(const LaunchPlan& p, const at::Tensor* const* in);

}  // namespace cuteforge_native
