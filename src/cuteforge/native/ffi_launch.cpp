// cuteforge's eager forward launch: allocate an op's outputs and call its compiled
// TVM-FFI kernel in one C call from Python.
//
// Why: at small sizes an op is host-bound, and its Python warm path paid for every
// output's `new_empty` (~1.6 us each on the H200's host) and for TVM-FFI's conversion of
// each torch tensor argument (a norm's kernel takes eight) on top of the launch itself,
// which left softmax and the norms 11-20 % behind torch's own ops at M <= 128. A launch
// table (below) takes the memo lookup out of Python as well.
//
// An op builds one LaunchPlan per call layout (cuteforge/native/launch.py), which its memo
// key fixes completely: the outputs to allocate (shape, dtype), its kernel's arguments in
// order (each an input, an output or a tensor the plan holds, with the (sizes, strides)
// view the kernel reads from an element offset), the steps after it on the same operands
// (kernels, and matrix products through ATen: a fused linear loss's chunk GEMMs), and which
// outputs the call returns.
// `launch(plan, *inputs)` trusts the layout (the op's memo lookup stands for its checks)
// and checks only what a lookup cannot: the count of inputs, that each is a tensor on
// the plan's device, or None where no argument reads it (an op's absent bias or residual).

#include "launch_plan.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <unordered_map>

namespace py = pybind11;

namespace cuteforge_native {
namespace {

constexpr const char* kCapsule = "cuteforge.native.LaunchPlan";

// A plan's capsule holds a PlanPtr: launch tables and dispatcher kernels share the plan.
void free_plan(PyObject* capsule) {
  delete static_cast<PlanPtr*>(PyCapsule_GetPointer(capsule, kCapsule));
}

const LaunchPlan* plan_of(PyObject* capsule) {
  const PlanPtr* h = plan_ptr_of(capsule);
  return h ? h->get() : nullptr;
}

// A returned output: an int (the output) or (index, row) (row `row` of it).
LaunchReturn make_return(const std::string& name, py::handle r, const std::vector<std::vector<int64_t>>& out_sizes) {
  LaunchReturn ret{0, -1};
  if (py::isinstance<py::tuple>(r)) {
    auto t = r.cast<py::tuple>();
    if (t.size() != 2) throw std::invalid_argument(name + ": a returned row is (output, row)");
    ret = {t[0].cast<int>(), t[1].cast<int64_t>()};
    if (ret.row < 0) throw std::invalid_argument(name + ": a returned row must be >= 0");
  } else {
    ret.index = r.cast<int>();
  }
  if (ret.index < 0 || static_cast<size_t>(ret.index) >= out_sizes.size())
    throw std::invalid_argument(name + ": a returned output does not exist");
  const auto& shape = out_sizes[ret.index];
  if (ret.row >= 0 && (shape.empty() || ret.row >= shape[0]))
    throw std::invalid_argument(name + ": a returned row is not in its output");
  return ret;
}

// One step of `p` (its outputs and fixed tensors set already): a kernel's call (fn and
// its operands) or, with fn == 0, a matrix product (kind kMatmul / kMatmulAdd, args
// (out, a, b)).
void add_step(LaunchPlan& p, int kind, uintptr_t fn, const std::vector<py::tuple>& args) {
  const std::string& name = p.name;
  if (kind == kKernel && !fn) throw std::invalid_argument(name + ": a launch plan's kernel step needs a kernel");
  if (kind != kKernel && kind != kMatmul && kind != kMatmulAdd)
    throw std::invalid_argument(name + ": a step is a kernel (0), a product (1) or an accumulated product (2)");
  if (kind != kKernel && args.size() != 3) throw std::invalid_argument(name + ": a product step takes (out, a, b)");
  if (args.size() > kMaxTensors) throw std::invalid_argument(name + ": at most 16 kernel arguments");
  PlanStep c;
  c.kind = kind;
  for (const auto& a : args) {
    LaunchArg s{a[0].cast<int>(), a[1].cast<int>(), a[2].cast<std::vector<int64_t>>(), a[3].cast<std::vector<int64_t>>(),
                a[4].cast<int64_t>()};
    const size_t bound = s.source == kInput ? p.n_inputs : s.source == kOutput ? p.out_sizes.size()
                         : s.source == kFixed ? p.fixed.size() : 0;
    if (s.index < 0 || static_cast<size_t>(s.index) >= bound)
      throw std::invalid_argument(name + ": a kernel argument names no input, output or fixed tensor");
    if (s.sizes.size() != s.strides.size()) throw std::invalid_argument(name + ": an argument's sizes and strides differ in length");
    if (kind != kKernel && s.sizes.size() != 2) throw std::invalid_argument(name + ": a product's operands are 2-D views");
    if (s.source == kInput) p.read[s.index] = true;
    c.args.push_back(std::move(s));
  }
  if (kind == kKernel) {
    c.fn = reinterpret_cast<TVMFFIObjectHandle>(fn);
    TVMFFIObjectIncRef(c.fn);
  }
  p.steps.push_back(std::move(c));
}

// `then`: (kind, fn, args) of the steps after the first kernel (fn; 0 where the plan
// starts with them), on the same stream and over the same inputs, outputs and fixed
// tensors: kernels (kind 0) and products (fn 0).
py::object make_launch_plan(const std::string& name, uintptr_t fn, const std::string& device_type, int64_t device_index,
                            size_t n_inputs, const std::vector<std::pair<std::vector<int64_t>, std::string>>& outs,
                            const std::vector<py::tuple>& args, const py::list& returns,
                            const std::vector<at::Tensor>& fixed,
                            const std::vector<std::tuple<int, uintptr_t, std::vector<py::tuple>>>& then) {
  if (n_inputs > kMaxTensors || outs.size() > kMaxTensors)
    throw std::invalid_argument(name + ": at most 16 inputs and outputs each");
  if (returns.empty()) throw std::invalid_argument(name + ": a launch plan returns at least one output");
  if (device_type != "cuda" && device_type != "cpu")
    throw std::invalid_argument(name + ": a launch plan runs on cuda or cpu, not " + device_type);
  auto p = std::make_shared<LaunchPlan>();
  p->name = name;
  p->device = device_type == "cuda" ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)) : at::Device(at::kCPU);
  p->dl_device = dl_device(p->device);
  p->n_inputs = n_inputs;
  p->read.assign(n_inputs, false);
  for (const auto& o : outs) {
    p->out_sizes.push_back(o.first);
    p->out_options.push_back(at::TensorOptions().dtype(scalar_type(o.second)).device(p->device));
  }
  if (fixed.size() > kMaxTensors) throw std::invalid_argument(name + ": at most 16 fixed tensors");
  for (const auto& t : fixed) {
    if (t.device() != p->device) throw std::invalid_argument(name + ": a fixed tensor is on another device than the plan");
    p->fixed.push_back(t);
  }
  if (fn) {
    add_step(*p, kKernel, fn, args);
  } else if (!args.empty() || then.empty()) {
    throw std::invalid_argument(name + ": a launch plan needs a kernel");
  }
  for (const auto& c : then) add_step(*p, std::get<0>(c), std::get<1>(c), std::get<2>(c));
  for (auto r : returns) p->returns.push_back(make_return(name, r, p->out_sizes));
  auto* h = new PlanPtr(std::move(p));
  PyObject* cap = PyCapsule_New(h, kCapsule, free_plan);
  if (!cap) {
    delete h;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

// Allocate p's outputs, call its kernel on `inputs`, return the output or a tuple of them;
// nullptr with a Python error set on bad input.
PyObject* run_from_python(const LaunchPlan& p, PyObject* const* inputs, size_t n) {
  if (n != p.n_inputs) {
    PyErr_Format(PyExc_TypeError, "%s: expected %zu input tensors, got %zu", p.name.c_str(), p.n_inputs, n);
    return nullptr;
  }
  const at::Tensor* in[kMaxTensors];
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = inputs[i];
    if (o == Py_None && !p.read[i]) {
      in[i] = nullptr;
      continue;
    }
    if (!THPVariable_Check(o)) {
      PyErr_Format(PyExc_TypeError, "%s: input %zu must be a torch.Tensor, got %s", p.name.c_str(), i, Py_TYPE(o)->tp_name);
      return nullptr;
    }
    in[i] = &THPVariable_Unpack(o);
  }
  // the GIL stays held: the call is a launch, microseconds
  Returned out = run_plan(p, in);
  if (out.size() == 1) return THPVariable_Wrap(std::move(out[0]));
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(out.size()));
  if (!tup) return nullptr;
  for (size_t k = 0; k < out.size(); ++k) {
    PyObject* t = THPVariable_Wrap(std::move(out[k]));
    if (!t) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(k), t);
  }
  return tup;
}

// launch(plan, *inputs) -> the returned output, or a tuple of them (METH_FASTCALL: no
// argument tuple, no pybind11 overload resolution on the warm path).
PyObject* launch(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  if (argc < 1) {
    PyErr_SetString(PyExc_TypeError, "launch(plan, *inputs): missing the plan");
    return nullptr;
  }
  const LaunchPlan* p = plan_of(argv[0]);
  if (!p) return nullptr;
  return run_from_python(*p, argv + 1, static_cast<size_t>(argc - 1));
  END_HANDLE_TH_ERRORS
}

// ---------------------------------------------------------------- launch tables
// An op's eager memo on the C side: its call layout -> plan, so that a warm call is one C
// call with no Python key. The key is the call's leading scalars (each an exact int,
// float, bool or None: its type is part of the key, so eps=True never meets eps=1's
// plan) and, per input, None or (dtype, device, sizes, strides, 16-byte alignment of the
// data pointer): what the ops' Python memo keys hold. Only plans the Python slow path
// made (after its checks) are put in; a miss, or an input that needs autograd while grad
// mode is on, returns None and the op takes its Python path.

using Key = LayoutKey;
using KeyHash = LayoutKeyHash;

struct LaunchTable {
  size_t n_scalars = 0;
  std::unordered_map<Key, PlanPtr, KeyHash> plans;
};

constexpr const char* kTable = "cuteforge.native.LaunchTable";

void free_table(PyObject* capsule) { delete static_cast<LaunchTable*>(PyCapsule_GetPointer(capsule, kTable)); }

// Append o (a leading scalar) to the key; false for any other type (no plan is keyed so).
bool key_scalar(Key& k, PyObject* o) {
  if (o == Py_None) {
    k.push_back(0);
  } else if (PyBool_Check(o)) {
    k.push_back(1);
    k.push_back(o == Py_True);
  } else if (PyLong_CheckExact(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    k.push_back(2);
    k.push_back(v);
  } else if (PyFloat_CheckExact(o)) {
    double d = PyFloat_AS_DOUBLE(o);
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    k.push_back(3);
    k.push_back(bits);
  } else {
    return false;
  }
  return true;
}

// Append input o to the key; false where it is neither None nor a plain tensor. `grad` is
// set when o needs autograd.
bool key_input(Key& k, PyObject* o, bool& grad) {
  if (o == Py_None) {
    k.push_back(-1);
    return true;
  }
  // plain strided tensors with their own memory only; everything else goes to the op's
  // Python path and its checks: __torch_function__ subclasses (their results must stay
  // theirs) and what key_tensor refuses. (torch.Tensor and nn.Parameter only:
  // THPVariable_CheckExact.)
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!key_tensor(k, t)) return false;
  grad = grad || t.requires_grad();
  return true;
}

// Build the key of argv = (scalars..., inputs...); false when no plan can be keyed so.
// Under a Python dispatch or torch-function mode nothing is keyed: the mode must see the
// op's calls.
bool make_key(const LaunchTable& tab, PyObject* const* argv, size_t argc, Key& k, bool& grad) {
  if (argc < tab.n_scalars || c10::impl::TorchDispatchModeTLS::any_modes_set() || at::impl::torch_function_mode_enabled())
    return false;
  for (size_t i = 0; i < tab.n_scalars; ++i) {
    if (!key_scalar(k, argv[i])) return false;
  }
  for (size_t i = tab.n_scalars; i < argc; ++i) {
    if (!key_input(k, argv[i], grad)) return false;
  }
  return true;
}

py::object make_table(size_t n_scalars) {
  auto* t = new LaunchTable();
  t->n_scalars = n_scalars;
  PyObject* cap = PyCapsule_New(t, kTable, free_table);
  if (!cap) {
    delete t;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

// table_put(table, scalars: tuple, inputs: tuple, plan) -> whether the plan was keyed by
// that call: False where the call has no key (a scalar of another type, such as a numpy
// float or an IntEnum, or an input that is no plain tensor): such calls stay on the op's
// Python path.
bool table_put(py::handle table, py::tuple scalars, py::tuple inputs, py::handle plan) {
  auto* tab = static_cast<LaunchTable*>(PyCapsule_GetPointer(table.ptr(), kTable));
  auto* h = static_cast<PlanPtr*>(PyCapsule_GetPointer(plan.ptr(), kCapsule));
  if (!tab || !h) throw py::error_already_set();
  if (scalars.size() != tab->n_scalars) throw std::invalid_argument("table_put: wrong number of scalars for this table");
  std::vector<PyObject*> argv;
  for (auto o : scalars) argv.push_back(o.ptr());
  for (auto o : inputs) argv.push_back(o.ptr());
  if (inputs.size() != (*h)->n_inputs) throw std::invalid_argument((*h)->name + ": table_put with the wrong number of inputs");
  Key k;
  bool grad = false;
  if (!make_key(*tab, argv.data(), argv.size(), k, grad)) return false;
  if (tab->plans.size() >= kMaxPlans) tab->plans.clear();
  tab->plans[k] = *h;
  return true;
}

size_t table_size(py::handle table) {
  auto* tab = static_cast<LaunchTable*>(PyCapsule_GetPointer(table.ptr(), kTable));
  if (!tab) throw py::error_already_set();
  return tab->plans.size();
}

// table_launch(table, *scalars, *inputs) -> the plan's outputs, or None: no plan for this
// layout, or an input needs autograd with grad mode on (the op's Python path decides).
PyObject* table_launch(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  if (argc < 1) {
    PyErr_SetString(PyExc_TypeError, "table_launch(table, *scalars, *inputs): missing the table");
    return nullptr;
  }
  auto* tab = static_cast<LaunchTable*>(PyCapsule_GetPointer(argv[0], kTable));
  if (!tab) return nullptr;
  Key k;
  bool grad = false;
  const size_t n = static_cast<size_t>(argc - 1);
  if (!make_key(*tab, argv + 1, n, k, grad) || (grad && at::GradMode::is_enabled())) Py_RETURN_NONE;
  auto it = tab->plans.find(k);
  if (it == tab->plans.end()) Py_RETURN_NONE;
  PlanPtr p = it->second;  // a launch may not outlive a clear() of the table under it
  return run_from_python(*p, argv + 1 + tab->n_scalars, n - tab->n_scalars);
  END_HANDLE_TH_ERRORS
}

PyMethodDef launch_def = {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&launch)), METH_FASTCALL,
                          "launch(plan, *inputs): allocate the plan's outputs, call its kernel, return its outputs"};
PyMethodDef table_launch_def = {
    "table_launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&table_launch)), METH_FASTCALL,
    "table_launch(table, *scalars, *inputs): the plan keyed by this call's layout, launched; None where there is none"};

}  // namespace

const PlanPtr* plan_ptr_of(PyObject* capsule) {
  return static_cast<PlanPtr*>(PyCapsule_GetPointer(capsule, kCapsule));
}

Returned run_plan(const LaunchPlan& p, const at::Tensor* const* in) {
  for (size_t i = 0; i < p.n_inputs; ++i) {
    TORCH_CHECK_VALUE(in[i] || !p.read[i], p.name, ": input ", i, " must be a torch.Tensor, got None");
    TORCH_CHECK_VALUE(!in[i] || in[i]->device() == p.device, p.name, ": input ", i, " is on ", in[i]->device().str(),
                      ", the plan on ", p.device.str());
  }
  at::Tensor out[kMaxTensors];
  for (size_t j = 0; j < p.out_sizes.size(); ++j) out[j] = at::empty(p.out_sizes[j], p.out_options[j]);
  DLTensor dl[kMaxTensors];
  TVMFFIAny any[kMaxTensors];
  auto tensor_of = [&](const LaunchArg& a) -> const at::Tensor& {
    return a.source == kInput ? *in[a.index] : a.source == kOutput ? out[a.index] : p.fixed[a.index];
  };
  for (const PlanStep& c : p.steps) {
    if (c.kind != kKernel) {  // (out, a, b) as strided views: ATen's mm picks cuBLAS's transposes
      at::Tensor v[3];
      for (size_t i = 0; i < 3; ++i) {
        const LaunchArg& a = c.args[i];
        const at::Tensor& t = tensor_of(a);
        v[i] = t.as_strided(a.sizes, a.strides, t.storage_offset() + a.offset);
      }
      if (c.kind == kMatmul) {
        at::mm_out(v[0], v[1], v[2]);
      } else {
        v[0].addmm_(v[1], v[2]);
      }
      continue;
    }
    for (size_t i = 0; i < c.args.size(); ++i) {
      const LaunchArg& a = c.args[i];
      fill_dltensor(dl[i], any[i], tensor_of(a), a.sizes, a.strides, a.offset, p.dl_device);
    }
    call_on_current_stream(c.fn, any, static_cast<int32_t>(c.args.size()), p.device, p.name);
  }
  Returned r;
  for (const LaunchReturn& ret : p.returns) r.push_back(ret.row >= 0 ? out[ret.index].select(0, ret.row) : out[ret.index]);
  return r;
}

void register_launch(py::module_& m) {
  m.def("make_launch_plan", &make_launch_plan, "A forward launch plan (see cuteforge/native/launch.py)");
  m.def("make_table", &make_table, "A launch table keyed by `n_scalars` leading scalars and the inputs' layouts");
  m.def("table_put", &table_put, "Key a plan in a launch table by one call's scalars and inputs");
  m.def("table_size", &table_size, "The number of plans a launch table holds");
  for (PyMethodDef* def : {&launch_def, &table_launch_def}) {
    PyObject* f = PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr());
    if (!f) throw py::error_already_set();
    m.add_object(def->ml_name, py::reinterpret_steal<py::object>(f));
  }
}

}  // namespace cuteforge_native
