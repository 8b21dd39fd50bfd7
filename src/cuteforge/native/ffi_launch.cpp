// cuteforge's eager forward launch: allocate an op's outputs and call its compiled
// TVM-FFI kernel in one C call from Python.
//
// Why: at small sizes an op is host-bound, and its Python warm path paid for every
// output's `new_empty` (~1.6 us each on the H200's host) and for TVM-FFI's conversion of
// each torch tensor argument (a norm's kernel takes eight) on top of the launch itself,
// which left softmax and the norms 12-18 % behind torch's own ops at M <= 128.
//
// An op builds one LaunchPlan per call layout (cuteforge/native/launch.py), which its memo
// key fixes completely: the outputs to allocate (shape, dtype), the kernel's arguments in
// order (each an input or an output, with the (sizes, strides) view the kernel reads from
// an element offset), and which outputs the call returns. `launch(plan, *inputs)` trusts
// the layout (the op's memo lookup stands for its checks) and checks only what a lookup
// cannot: the count of inputs, that each is a tensor on the plan's device, or None where
// no argument reads it (an op's absent bias or residual).

#include "ffi_common.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace cuteforge_native {
namespace {

constexpr const char* kCapsule = "cuteforge.native.LaunchPlan";
constexpr size_t kMaxTensors = 16;  // inputs, outputs and kernel arguments, each

enum LaunchSource : int { kInput = 0, kOutput = 1 };

struct LaunchArg {
  int source;  // LaunchSource
  int index;
  std::vector<int64_t> sizes, strides;
  int64_t offset;  // elements from the tensor's data pointer
};

struct LaunchPlan {
  std::string name;
  TVMFFIObjectHandle fn = nullptr;  // owned reference
  at::Device device{at::kCPU};
  DLDevice dl_device{kDLCPU, 0};
  size_t n_inputs = 0;
  std::vector<bool> read;  // per input: some argument reads it (else None is accepted)
  std::vector<std::vector<int64_t>> out_sizes;
  std::vector<at::TensorOptions> out_options;
  std::vector<LaunchArg> args;
  std::vector<int> returns;  // output indices: one returns the tensor, more a tuple

  ~LaunchPlan() {
    if (fn) TVMFFIObjectDecRef(fn);
  }
};

void free_plan(PyObject* capsule) {
  delete static_cast<LaunchPlan*>(PyCapsule_GetPointer(capsule, kCapsule));
}

py::object make_launch_plan(const std::string& name, uintptr_t fn, const std::string& device_type, int64_t device_index,
                            size_t n_inputs, const std::vector<std::pair<std::vector<int64_t>, std::string>>& outs,
                            const std::vector<py::tuple>& args, const std::vector<int>& returns) {
  if (!fn) throw std::invalid_argument(name + ": a launch plan needs a kernel");
  if (n_inputs > kMaxTensors || outs.size() > kMaxTensors || args.size() > kMaxTensors)
    throw std::invalid_argument(name + ": at most 16 inputs, outputs and kernel arguments each");
  if (returns.empty()) throw std::invalid_argument(name + ": a launch plan returns at least one output");
  auto p = std::make_unique<LaunchPlan>();
  p->name = name;
  p->device = device_type == "cuda" ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)) : at::Device(at::kCPU);
  p->dl_device = dl_device(p->device);
  p->n_inputs = n_inputs;
  p->read.assign(n_inputs, false);
  for (const auto& o : outs) {
    p->out_sizes.push_back(o.first);
    p->out_options.push_back(at::TensorOptions().dtype(scalar_type(o.second)).device(p->device));
  }
  for (const auto& a : args) {
    LaunchArg s{a[0].cast<int>(), a[1].cast<int>(), a[2].cast<std::vector<int64_t>>(), a[3].cast<std::vector<int64_t>>(),
                a[4].cast<int64_t>()};
    const size_t bound = s.source == kInput ? n_inputs : s.source == kOutput ? outs.size() : 0;
    if (s.index < 0 || static_cast<size_t>(s.index) >= bound)
      throw std::invalid_argument(name + ": a kernel argument names no input or output");
    if (s.sizes.size() != s.strides.size()) throw std::invalid_argument(name + ": an argument's sizes and strides differ in length");
    if (s.source == kInput) p->read[s.index] = true;
    p->args.push_back(std::move(s));
  }
  for (int r : returns) {
    if (r < 0 || static_cast<size_t>(r) >= outs.size()) throw std::invalid_argument(name + ": a returned output does not exist");
  }
  p->returns = returns;
  p->fn = reinterpret_cast<TVMFFIObjectHandle>(fn);
  TVMFFIObjectIncRef(p->fn);
  PyObject* cap = PyCapsule_New(p.get(), kCapsule, free_plan);
  if (!cap) throw py::error_already_set();
  p.release();
  return py::reinterpret_steal<py::object>(cap);
}

// launch(plan, *inputs) -> the returned output, or a tuple of them (METH_FASTCALL: no
// argument tuple, no pybind11 overload resolution on the warm path).
PyObject* launch(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  if (argc < 1) {
    PyErr_SetString(PyExc_TypeError, "launch(plan, *inputs): missing the plan");
    return nullptr;
  }
  auto* p = static_cast<LaunchPlan*>(PyCapsule_GetPointer(argv[0], kCapsule));
  if (!p) return nullptr;
  const size_t n = static_cast<size_t>(argc - 1);
  if (n != p->n_inputs) {
    PyErr_Format(PyExc_TypeError, "%s: expected %zu input tensors, got %zu", p->name.c_str(), p->n_inputs, n);
    return nullptr;
  }
  const at::Tensor* in[kMaxTensors];
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = argv[i + 1];
    if (o == Py_None && !p->read[i]) {
      in[i] = nullptr;
      continue;
    }
    if (!THPVariable_Check(o)) {
      PyErr_Format(PyExc_TypeError, "%s: input %zu must be a torch.Tensor, got %s", p->name.c_str(), i, Py_TYPE(o)->tp_name);
      return nullptr;
    }
    in[i] = &THPVariable_Unpack(o);
    if (in[i]->device() != p->device) {
      PyErr_Format(PyExc_ValueError, "%s: input %zu is on %s, the plan on %s", p->name.c_str(), i,
                   in[i]->device().str().c_str(), p->device.str().c_str());
      return nullptr;
    }
  }
  at::Tensor out[kMaxTensors];
  for (size_t j = 0; j < p->out_sizes.size(); ++j) out[j] = at::empty(p->out_sizes[j], p->out_options[j]);
  DLTensor dl[kMaxTensors];
  TVMFFIAny any[kMaxTensors];
  for (size_t i = 0; i < p->args.size(); ++i) {
    const LaunchArg& a = p->args[i];
    fill_dltensor(dl[i], any[i], a.source == kInput ? *in[a.index] : out[a.index], a.sizes, a.strides, a.offset, p->dl_device);
  }
  // the GIL stays held: the call is a launch, microseconds
  call_on_current_stream(p->fn, any, static_cast<int32_t>(p->args.size()), p->device, p->name);
  if (p->returns.size() == 1) return THPVariable_Wrap(std::move(out[p->returns[0]]));
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(p->returns.size()));
  if (!tup) return nullptr;
  for (size_t k = 0; k < p->returns.size(); ++k) {
    PyObject* t = THPVariable_Wrap(out[p->returns[k]]);
    if (!t) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(k), t);
  }
  return tup;
  END_HANDLE_TH_ERRORS
}

PyMethodDef launch_def = {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&launch)), METH_FASTCALL,
                          "launch(plan, *inputs): allocate the plan's outputs, call its kernel, return its outputs"};

}  // namespace

void register_launch(py::module_& m) {
  m.def("make_launch_plan", &make_launch_plan, "A forward launch plan (see cuteforge/native/launch.py)");
  PyObject* f = PyCFunction_NewEx(&launch_def, nullptr, m.attr("__name__").ptr());
  if (!f) throw py::error_already_set();
  m.add_object("launch", py::reinterpret_steal<py::object>(f));
}

}  // namespace cuteforge_native
