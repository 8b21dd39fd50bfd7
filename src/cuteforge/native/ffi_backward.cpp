// cuteforge's eager autograd node: a C++ torch::autograd::Node whose backward calls a
// compiled TVM-FFI kernel through the TVM-FFI C ABI, without Python.
//
// Why: the autograd engine runs a CUDA node's backward on its device thread. A Python
// node (torch.autograd.Function) must take the GIL there: on the H200 the same backward
// kernel took 95 us per call behind a Python node and 39 us behind a C++ one
// (docs/kernels/norm.md), more than the kernel itself at small sizes.
//
// The node knows nothing about any op. Python builds a Plan per forward layout
// (cuteforge/native/backward.py): which incoming gradients the kernel takes and the
// layout each must have, which buffers to allocate, the kernels' argument lists in call
// order (each a saved tensor, a gradient or a buffer, with the (sizes, strides) view the
// kernel reads: a norm's backward kernel, then the column sum of its dweight partials),
// and which buffer, or which row of one, answers which input. A gradient in any other
// layout, an undefined one, a double backward (grad mode on) or a plan without a kernel
// goes to the plan's Python fallback, which is the op's ordinary backward.

#include "ffi_common.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace ag = torch::autograd;
namespace py = pybind11;

namespace {

// torch 2.13 holds nodes in c10::intrusive_ptr, earlier releases in std::shared_ptr.
using NodePtr = decltype(ag::Edge::function);

template <class T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<ag::Node>>) {
    return std::make_shared<T>();
  } else {
    return c10::make_intrusive<T>();
  }
}

using cuteforge_native::scalar_type;

enum Source : int { kSaved = 0, kGrad = 1, kBuffer = 2 };

// An incoming gradient the kernel reads.
struct GradSpec {
  int transform;  // 0: as is (checked below); 1: a 0-dim loss gradient spread over `rows` fp32 rows
  at::ScalarType dtype;
  std::vector<int64_t> sizes;  // transform 0: the contiguous layout it must have
  int64_t rows;                // transform 1
  int divide_by_saved;         // transform 1: >= 0 divides by saved[k][rows] (a mean's count)
};

struct ArgSpec {
  int source;  // Source
  int index;
  std::vector<int64_t> sizes, strides;  // the view the kernel reads
  int64_t offset;                       // in elements from the tensor's data pointer
};

struct OutSpec {
  int kind;  // 0: no gradient; 1: a buffer
  int index;
  int64_t row;  // >= 0: that row (dim 0) of the buffer (dweight and dbias of one (2, N) buffer)
};

struct Call {
  TVMFFIObjectHandle fn;  // owned reference
  std::vector<ArgSpec> args;
};

struct Plan {
  std::string name;
  std::vector<Call> calls;  // in order, on the current stream; none: always the fallback
  at::Device device{at::kCPU};
  std::vector<GradSpec> grads;
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> buffers;
  std::vector<OutSpec> outs;
  size_t n_saved = 0;   // saved tensors the kernels read (kSaved indices below it)
  py::object fallback;  // fallback(grads: list, saved: list) -> list of input gradients

  ~Plan() {
    for (const Call& c : calls) TVMFFIObjectDecRef(c.fn);
    if (Py_IsInitialized()) {  // the last node may die on an autograd thread
      py::gil_scoped_acquire gil;
      fallback = py::object();
    } else {
      fallback.release();
    }
  }
};

bool aligned(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

struct FfiBackward : public ag::Node {
  std::shared_ptr<const Plan> plan;
  std::vector<ag::SavedVariable> saved;

  std::string name() const override { return plan->name; }

  void release_variables() override {
    for (auto& s : saved) s.reset_data();
  }

  ag::variable_list apply(ag::variable_list&& grads) override {
    std::vector<at::Tensor> sv;
    sv.reserve(saved.size());
    for (auto& s : saved) sv.push_back(s.unpack());  // raises if freed or modified in place
    const Plan& p = *plan;
    std::vector<at::Tensor> g(p.grads.size());
    bool fast = !p.calls.empty() && !at::GradMode::is_enabled() && grads.size() == p.grads.size();
    for (size_t i = 0; fast && i < p.grads.size(); ++i) {
      const GradSpec& s = p.grads[i];
      const at::Tensor& t = grads[i];
      if (!t.defined() || t.device() != p.device) {
        fast = false;
      } else if (s.transform == 0) {
        fast = t.scalar_type() == s.dtype && t.sizes().equals(s.sizes) && t.is_contiguous() && aligned(t);
        g[i] = t;
      } else {
        fast = t.dim() == 0;
        if (fast) {  // one kernel: fp32 (g [/ count]) broadcast over the rows
          at::Tensor v = at::empty({s.rows}, at::TensorOptions().dtype(at::kFloat).device(p.device));
          if (s.divide_by_saved >= 0) {
            at::div_out(v, t.expand({s.rows}), sv[s.divide_by_saved].select(0, s.rows).expand({s.rows}));
          } else {
            v.copy_(t.expand({s.rows}));
          }
          g[i] = v;
        }
      }
    }
    if (!fast) return fallback(grads, sv);

    std::vector<at::Tensor> bufs;
    bufs.reserve(p.buffers.size());
    for (const auto& b : p.buffers) bufs.push_back(at::empty(b.first, at::TensorOptions().dtype(b.second).device(p.device)));

    const DLDevice dev = cuteforge_native::dl_device(p.device);
    for (size_t k = 0; k < p.calls.size(); ++k) {
      const Call& c = p.calls[k];
      if (k > 0 && !wanted(c)) continue;  // dweight's column sum where only dx is asked for
      std::vector<DLTensor> dl(c.args.size());
      std::vector<TVMFFIAny> any(c.args.size());
      for (size_t i = 0; i < c.args.size(); ++i) {
        const ArgSpec& a = c.args[i];
        const at::Tensor& t = a.source == kSaved ? sv[a.index] : a.source == kGrad ? g[a.index] : bufs[a.index];
        cuteforge_native::fill_dltensor(dl[i], any[i], t, a.sizes, a.strides, a.offset, dev);
      }
      cuteforge_native::call_on_current_stream(c.fn, any.data(), static_cast<int32_t>(any.size()), p.device, p.name);
    }

    ag::variable_list out(p.outs.size());
    for (size_t i = 0; i < p.outs.size(); ++i) {
      const OutSpec& o = p.outs[i];
      if (o.kind == 1 && task_should_compute_output(i)) out[i] = o.row >= 0 ? bufs[o.index].select(0, o.row) : bufs[o.index];
    }
    return out;
  }

  // Whether a call after the first serves a gradient this backward computes: one of them
  // is a buffer the call reads or writes.
  bool wanted(const Call& c) {
    const Plan& p = *plan;
    for (size_t i = 0; i < p.outs.size(); ++i) {
      const OutSpec& o = p.outs[i];
      if (o.kind != 1 || !task_should_compute_output(i)) continue;
      for (const ArgSpec& a : c.args) {
        if (a.source == kBuffer && a.index == o.index) return true;
      }
    }
    return false;
  }

  ag::variable_list fallback(const ag::variable_list& grads, const std::vector<at::Tensor>& sv) {
    py::gil_scoped_acquire gil;
    try {
      py::list gl, sl;
      for (const auto& t : grads) t.defined() ? gl.append(t) : gl.append(py::none());
      for (const auto& t : sv) t.defined() ? sl.append(t) : sl.append(py::none());
      py::object r = plan->fallback(gl, sl);
      ag::variable_list out;
      for (py::handle h : r) out.push_back(h.is_none() ? at::Tensor() : h.cast<at::Tensor>());
      return out;
    } catch (py::error_already_set& e) {
      e.restore();  // keep the Python exception (type and message) for the caller
      python_error err;
      err.persist();
      throw err;
    }
  }
};

// One kernel call of `p`: fn and its operands (saved tensors, gradients, buffers).
void add_call(Plan& p, uintptr_t fn, const std::vector<py::tuple>& args) {
  if (!fn) throw std::invalid_argument(p.name + ": a kernel step needs a kernel");
  Call c{nullptr, {}};
  for (const auto& a : args) {
    ArgSpec s{a[0].cast<int>(), a[1].cast<int>(), a[2].cast<std::vector<int64_t>>(), a[3].cast<std::vector<int64_t>>(),
              a[4].cast<int64_t>()};
    if (s.sizes.size() != s.strides.size()) throw std::invalid_argument(p.name + ": an argument's sizes and strides differ in length");
    const size_t bound = s.source == kSaved ? SIZE_MAX : s.source == kGrad ? p.grads.size()
                         : s.source == kBuffer ? p.buffers.size() : 0;
    if (s.index < 0 || static_cast<size_t>(s.index) >= bound)
      throw std::invalid_argument(p.name + ": a kernel argument names no saved tensor, gradient or buffer");
    if (s.source == kSaved) p.n_saved = std::max(p.n_saved, static_cast<size_t>(s.index) + 1);
    c.args.push_back(std::move(s));
  }
  c.fn = reinterpret_cast<TVMFFIObjectHandle>(fn);
  TVMFFIObjectIncRef(c.fn);
  p.calls.push_back(std::move(c));
}

// fn == 0: no kernel, every backward takes the fallback. `then`: (kind, fn, args) of the
// kernels called after fn, in order (kind 0: `launch.kernel_step`'s tuples).
std::shared_ptr<Plan> make_plan(const std::string& name, uintptr_t fn, const std::string& device_type, int64_t device_index,
                                const std::vector<py::tuple>& grads,
                                const std::vector<std::pair<std::vector<int64_t>, std::string>>& buffers,
                                const std::vector<py::tuple>& args, const std::vector<py::tuple>& outs, py::object fallback,
                                const std::vector<std::tuple<int, uintptr_t, std::vector<py::tuple>>>& then) {
  auto p = std::make_shared<Plan>();
  p->name = name;
  p->device = device_type == "cuda" ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)) : at::Device(at::kCPU);
  for (const auto& g : grads) {
    p->grads.push_back({g[0].cast<int>(), scalar_type(g[1].cast<std::string>()), g[2].cast<std::vector<int64_t>>(),
                        g[3].cast<int64_t>(), g[4].cast<int>()});
    if (p->grads.back().divide_by_saved >= 0)
      p->n_saved = std::max(p->n_saved, static_cast<size_t>(p->grads.back().divide_by_saved) + 1);
  }
  for (const auto& b : buffers) p->buffers.emplace_back(b.first, scalar_type(b.second));
  for (const auto& o : outs) {
    OutSpec s{o[0].cast<int>(), o[1].cast<int>(), o[2].cast<int64_t>()};
    if (s.kind != 0 && s.kind != 1) throw std::invalid_argument(name + ": an out is no gradient (0) or a buffer (1)");
    if (s.kind == 1 && (s.index < 0 || static_cast<size_t>(s.index) >= p->buffers.size()))
      throw std::invalid_argument(name + ": an out names no buffer");
    if (s.kind == 1 && s.row >= 0) {
      const auto& shape = p->buffers[s.index].first;
      if (shape.empty() || s.row >= shape[0]) throw std::invalid_argument(name + ": an out's row is not in its buffer");
    }
    p->outs.push_back(s);
  }
  p->fallback = std::move(fallback);
  if (fn) {
    add_call(*p, fn, args);
    for (const auto& c : then) {
      if (std::get<0>(c) != 0) throw std::invalid_argument(name + ": a backward's later steps are kernels");
      add_call(*p, std::get<1>(c), std::get<2>(c));
    }
  }
  return p;
}

// Record the backward of an already computed forward: `inputs` are the forward's
// differentiable inputs (None where absent), one gradient edge each; `outputs` get this
// node as grad_fn; `saved` are kept for the backward (an output among them is kept as a
// detached alias: same storage and version counter, no reference cycle).
void attach(const std::shared_ptr<Plan>& plan, const std::vector<std::optional<at::Tensor>>& inputs,
            const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& saved) {
  TORCH_CHECK_VALUE(saved.size() >= plan->n_saved, plan->name, ": the plan reads ", plan->n_saved,
                    " saved tensors, ", saved.size(), " were given");
  auto node = make_node<FfiBackward>();
  node->plan = plan;
  ag::edge_list edges;
  edges.reserve(inputs.size());
  for (const auto& t : inputs) {
    if (t.has_value() && t->defined() && t->requires_grad()) {
      edges.push_back(ag::impl::gradient_edge(*t));
    } else {
      edges.emplace_back();
    }
  }
  node->set_next_edges(std::move(edges));
  node->saved.reserve(saved.size());
  for (const auto& t : saved) {
    bool is_output = false;
    for (const auto& o : outputs) is_output = is_output || o.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    node->saved.emplace_back(is_output ? t.detach() : t, false);
  }
  NodePtr fn(std::move(node));
  for (const auto& o : outputs) ag::set_history(const_cast<at::Tensor&>(o), fn);
}

}  // namespace

namespace cuteforge_native {
void register_launch(py::module_& m);    // ffi_launch.cpp
void register_dispatch(py::module_& m);  // ffi_dispatch.cpp
void register_call(py::module_& m);      // ffi_call.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan");
  m.def("make_plan", &make_plan, "A backward plan (see cuteforge/native/backward.py)");
  m.def("attach", &attach, "Attach a C++ backward node to computed outputs");
  cuteforge_native::register_launch(m);
  cuteforge_native::register_dispatch(m);
  cuteforge_native::register_call(m);
}
