// Dispatcher kernels for cuteforge's registered ops (torch.ops.cuteforge.*): a warm call
// inside a compiled graph runs no Python.
//
// Why: Inductor's generated code calls each op through torch's dispatcher. With the
// Python implementations of torch.library.custom_op, every call paid for the Python
// autograd kernel (a redispatch from Python), the Python CUDA kernel and the op's memo
// lookup: tens of microseconds of host time a call, against a few for the same op's warm
// eager call. Here each registered op gets two C++ kernels:
//
// - CUDA (the backend key): the op's table, its call layout (every argument: tensors by
//   dtype, device, sizes, strides and 16-byte alignment, scalars by type and value) ->
//   the launch plan (launch_plan.h) the op's Python implementation made for it. A hit
//   allocates the outputs and launches the compiled kernel; a miss takes the GIL and
//   calls the op's Python implementation, which returns its result and the plan for
//   this layout (None where the layout has none: that call stays on Python).
// - AutogradCUDA: with grad mode off or no input that requires grad (a compiled graph's
//   forward and backward run so), a redispatch below autograd, as the Python autograd
//   kernel of torch.library does; otherwise that Python kernel (tracing, double
//   backward), with the dispatch keys it would have received.
//
// The registrations live as long as the process (their torch::Library objects are never
// destroyed: unregistering at exit would run after Python is gone).

#include "launch_plan.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace py = pybind11;

namespace cuteforge_native {
namespace {

struct OpTable {
  std::string name;
  size_t n_args = 0;
  std::vector<bool> tensor_arg;  // per schema argument: Tensor or Tensor?
  size_t n_tensor_args = 0;
  size_t n_returns = 0;
  std::shared_mutex mu;  // the kernels run without the GIL, on any thread
  std::unordered_map<LayoutKey, PlanPtr, LayoutKeyHash> plans;
  PyObject* miss = nullptr;  // owned: (*args) -> (result, plan capsule or None)
  PyObject* grad = nullptr;  // owned: (dispatch keys as int, *args) -> result
};

// Append one argument to the key; false for a value no plan is keyed by.
bool key_arg(LayoutKey& k, const c10::IValue& v) {
  if (v.isNone()) {
    k.push_back(-1);
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      k.push_back(-1);
    } else {
      k.push_back(-2);
      return key_tensor(k, t);
    }
  } else if (v.isBool()) {
    k.push_back(1);
    k.push_back(v.toBool());
  } else if (v.isInt()) {
    k.push_back(2);
    k.push_back(v.toInt());
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    k.push_back(3);
    k.push_back(bits);
  } else if (v.isIntList()) {
    const auto l = v.toIntVector();
    k.push_back(4);
    k.push_back(static_cast<int64_t>(l.size()));
    k.append(l.begin(), l.end());
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    k.push_back(5);
    k.push_back(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      k.push_back(w);
    }
  } else {
    return false;
  }
  return true;
}

// Replace the op's arguments on the stack by its Python result (a tensor, or a tuple of
// n_returns tensors).
void push_result(const OpTable& t, const py::object& result, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, t.n_args);
  auto push = [&](PyObject* o) {
    TORCH_CHECK_TYPE(THPVariable_Check(o), t.name, ": the implementation returned ", Py_TYPE(o)->tp_name,
                     " where a tensor is due");
    stack->emplace_back(THPVariable_Unpack(o));
  };
  if (t.n_returns == 1) {
    push(result.ptr());
    return;
  }
  TORCH_CHECK_TYPE(py::isinstance<py::tuple>(result) && py::len(result) == t.n_returns, t.name,
                   ": the implementation must return a tuple of ", t.n_returns, " tensors");
  for (auto o : result.cast<py::tuple>()) push(o.ptr());
}

py::tuple python_args(const OpTable& t, c10::ArrayRef<c10::IValue> args, size_t lead) {
  py::tuple out(t.n_args + lead);
  for (size_t i = 0; i < t.n_args; ++i) out[i + lead] = torch::jit::toPyObject(args[i]);
  return out;
}

class PlanKernel final : public c10::OperatorKernel {
 public:
  explicit PlanKernel(std::shared_ptr<OpTable> t) : t_(std::move(t)) {}

  void operator()(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet /*ks*/, torch::jit::Stack* stack) {
    OpTable& t = *t_;
    auto args = torch::jit::last(*stack, t.n_args);
    LayoutKey k;
    bool keyed = true;
    for (const auto& v : args) {
      if (!key_arg(k, v)) {
        keyed = false;
        break;
      }
    }
    PlanPtr p;
    if (keyed) {
      std::shared_lock<std::shared_mutex> lock(t.mu);
      auto it = t.plans.find(k);
      if (it != t.plans.end()) p = it->second;
    }
    if (p) {
      const at::Tensor* in[kMaxTensors];
      size_t n = 0;
      for (size_t i = 0; i < t.n_args; ++i) {
        if (t.tensor_arg[i]) in[n++] = args[i].isTensor() ? &args[i].toTensor() : nullptr;
      }
      Returned r = run_plan(*p, in);
      torch::jit::drop(*stack, t.n_args);
      for (auto& x : r) stack->emplace_back(std::move(x));
      return;
    }
    py::gil_scoped_acquire gil;
    py::tuple res = py::reinterpret_borrow<py::object>(t.miss)(*python_args(t, args, 0));
    TORCH_CHECK(res.size() == 2, t.name, ": the miss handler must return (result, plan)");
    py::object plan = res[1];
    if (keyed && !plan.is_none()) {
      const PlanPtr* h = plan_ptr_of(plan.ptr());
      if (!h) throw py::error_already_set();
      TORCH_CHECK((*h)->n_inputs == t.n_tensor_args && (*h)->returns.size() == t.n_returns, t.name,
                  ": a plan takes the op's tensor arguments and returns its outputs");
      std::unique_lock<std::shared_mutex> lock(t.mu);
      if (t.plans.size() >= kMaxPlans) t.plans.clear();
      t.plans[k] = *h;
    }
    push_result(t, res[0], stack);
  }

 private:
  std::shared_ptr<OpTable> t_;
};

class GradKernel final : public c10::OperatorKernel {
 public:
  explicit GradKernel(std::shared_ptr<OpTable> t) : t_(std::move(t)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const OpTable& t = *t_;
    auto args = torch::jit::last(*stack, t.n_args);
    bool wants_grad = false;
    if (at::GradMode::is_enabled()) {
      for (const auto& v : args) wants_grad = wants_grad || (v.isTensor() && v.toTensor().requires_grad());
    }
    if (wants_grad) {
      py::gil_scoped_acquire gil;
      py::tuple a = python_args(t, args, 1);
      a[0] = py::int_(ks.raw_repr());
      py::object result = py::reinterpret_borrow<py::object>(t.grad)(*a);
      push_result(t, result, stack);
      return;
    }
    at::AutoDispatchBelowAutograd below;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  }

 private:
  std::shared_ptr<OpTable> t_;
};

std::unordered_map<std::string, std::shared_ptr<OpTable>>& registered() {
  static auto* ops = new std::unordered_map<std::string, std::shared_ptr<OpTable>>();  // never destroyed (see top)
  return *ops;
}

// register_op("ns::name", miss, grad, backend): the C++ kernels for the op's `backend`
// ("CUDA"; "CPU" for tests) and its autograd key. Registering an op again replaces its
// Python callbacks and forgets its plans (its kernels stay).
void register_op(const std::string& qualname, py::object miss, py::object grad, const std::string& backend) {
  const auto sep = qualname.find("::");
  TORCH_CHECK_VALUE(sep != std::string::npos, "register_op: '", qualname, "' is no ns::name");
  TORCH_CHECK_VALUE(backend == "CUDA" || backend == "CPU", "register_op: backend must be CUDA or CPU, not ", backend);
  const std::string key = qualname + "/" + backend;
  auto& ops = registered();
  auto found = ops.find(key);
  if (found != ops.end()) {
    OpTable& t = *found->second;
    std::unique_lock<std::shared_mutex> lock(t.mu);
    Py_XDECREF(t.miss);
    Py_XDECREF(t.grad);
    t.miss = miss.release().ptr();
    t.grad = grad.release().ptr();
    t.plans.clear();
    return;
  }
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualname.c_str(), "");
  const c10::FunctionSchema& schema = op.schema();
  auto t = std::make_shared<OpTable>();
  t->name = qualname;
  t->n_args = schema.arguments().size();
  const auto tensor_or_none = c10::OptionalType::ofTensor();
  for (const auto& a : schema.arguments()) {
    TORCH_CHECK_VALUE(!a.kwarg_only(), qualname, ": keyword-only arguments are not supported");
    const bool is_tensor = a.type()->isSubtypeOf(*tensor_or_none);
    t->tensor_arg.push_back(is_tensor);
    t->n_tensor_args += is_tensor;
  }
  TORCH_CHECK_VALUE(t->n_tensor_args <= kMaxTensors, qualname, ": at most 16 tensor arguments");
  for (const auto& r : schema.returns()) {
    TORCH_CHECK_VALUE(r.type()->isSubtypeOf(*c10::TensorType::get()), qualname, ": every return must be a Tensor");
  }
  t->n_returns = schema.returns().size();
  TORCH_CHECK_VALUE(t->n_returns >= 1, qualname, ": an op without returns has nothing to plan");
  t->miss = miss.release().ptr();
  t->grad = grad.release().ptr();
  const std::string ns = qualname.substr(0, sep), name = qualname.substr(sep + 2);
  const bool cuda = backend == "CUDA";
  // never destroyed (see top)
  auto* lib = new torch::Library(torch::Library::IMPL, ns, cuda ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU,
                                 __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<PlanKernel>(t)));
  auto* grad_lib = new torch::Library(torch::Library::IMPL, ns,
                                      cuda ? c10::DispatchKey::AutogradCUDA : c10::DispatchKey::AutogradCPU, __FILE__,
                                      __LINE__);
  grad_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<GradKernel>(t)));
  ops.emplace(key, std::move(t));
}

size_t op_plans(const std::string& qualname, const std::string& backend) {
  auto& ops = registered();
  auto it = ops.find(qualname + "/" + backend);
  if (it == ops.end()) return 0;
  std::shared_lock<std::shared_mutex> lock(it->second->mu);
  return it->second->plans.size();
}

}  // namespace

void register_dispatch(py::module_& m) {
  m.def("register_op", &register_op, py::arg("qualname"), py::arg("miss"), py::arg("grad"), py::arg("backend") = "CUDA",
        "C++ backend and autograd kernels for a registered op (see cuteforge/native/dispatch.py)");
  m.def("op_plans", &op_plans, py::arg("qualname"), py::arg("backend") = "CUDA",
        "The number of launch plans an op's dispatcher kernel holds");
}

}  // namespace cuteforge_native
