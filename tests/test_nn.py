"""cuteforge.nn on the CPU: each module matches the torch module it replaces (CPU tensors
take torch's ops; the CUDA paths are in tests/gpu/test_nn_gpu.py), state_dicts load both
ways, and `patch` swaps a Llama-style model's modules and loss reversibly, refusing what
it cannot handle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuteforge
import cuteforge.nn as cnn


def test_modules_match_torch_and_share_state_dicts() -> None:
    x = torch.randn(3, 5, 16)
    ours, theirs = cnn.RMSNorm(16, eps=1e-6), nn.RMSNorm(16, eps=1e-6)
    theirs.weight.data.normal_()
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x), theirs(x))
    ln, tln = cnn.LayerNorm(16), nn.LayerNorm(16)
    tln.weight.data.normal_()
    tln.bias.data.normal_()
    ln.load_state_dict(tln.state_dict())
    torch.testing.assert_close(ln(x), tln(x))
    lin = cnn.Linear(16, 8, activation="silu")
    tlin = nn.Linear(16, 8)
    tlin.load_state_dict(lin.state_dict())
    torch.testing.assert_close(lin(x), F.silu(tlin(x)))
    logits, target = torch.randn(6, 10), torch.tensor([1, 2, -100, 3, 9, 0])
    for reduction in ("mean", "sum", "none"):
        torch.testing.assert_close(cnn.CrossEntropyLoss(reduction=reduction)(logits, target),
                                   F.cross_entropy(logits, target, reduction=reduction))


def test_cross_entropy_loss_takes_torch_layouts_and_classes_last() -> None:
    # torch's (N, C, d): with C == d both layouts fit the target and torch's must win
    for shape in ((2, 3, 3), (2, 5, 4), (2, 5, 4, 3)):
        logits = torch.randn(*shape)
        target = torch.randint(0, shape[1], (shape[0], *shape[2:]))
        for reduction in ("mean", "none"):
            torch.testing.assert_close(cnn.CrossEntropyLoss(reduction=reduction)(logits, target),
                                       nn.CrossEntropyLoss(reduction=reduction)(logits, target))
    # a language model's (B, S, V) with (B, S) labels, and torch's unbatched (C,) with ()
    logits, target = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
    torch.testing.assert_close(cnn.CrossEntropyLoss(reduction="none")(logits, target),
                               F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), reduction="none").view(2, 7))
    torch.testing.assert_close(cnn.CrossEntropyLoss()(logits[0, 0], target[0, 0]),
                               F.cross_entropy(logits[0, 0], target[0, 0]))
    with pytest.raises(ValueError, match="fits neither layout"):
        cnn.CrossEntropyLoss()(logits, target[:, :3])


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="normalized_shape"):
        cnn.RMSNorm((4, 4))
    with pytest.raises(ValueError, match="activation"):
        cnn.Linear(4, 4, activation="tanh")
    with pytest.raises(ValueError, match="reduction"):
        cnn.CrossEntropyLoss(reduction="avg")


def test_causal_lm_loss_shifts_the_labels() -> None:
    logits = torch.randn(2, 7, 11)
    labels = torch.randint(0, 11, (2, 7))
    labels[0, 3] = -100
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(cnn.causal_lm_loss(logits, labels, 11), want)
    items = (labels[:, 1:] != -100).sum()
    torch.testing.assert_close(cnn.causal_lm_loss(logits, labels, 11, num_items_in_batch=items), want)


# --- a stand-in for a transformers Llama (the real one runs in tests/gpu) --------------------


class _Config:
    model_type = "llama"
    hidden_act = "silu"


class LlamaRMSNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)


class LlamaMLP(nn.Module):
    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, i, False), nn.Linear(h, i, False), nn.Linear(i, h, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _stock_loss(logits, labels, vocab_size, **_):
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab_size).float(), labels[:, 1:].reshape(-1))


class _TinyLM(nn.Module):
    def __init__(self, h: int = 16, vocab: int = 32) -> None:
        super().__init__()
        self.config = _Config()
        self.embed = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(nn.ModuleDict({"norm": LlamaRMSNorm(h), "mlp": LlamaMLP(h, 24)}) for _ in range(2))
        self.norm = LlamaRMSNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)

    @property
    def loss_function(self):
        return getattr(self, "_loss_function", None) or _stock_loss

    @loss_function.setter
    def loss_function(self, value):
        self._loss_function = value

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer["mlp"](layer["norm"](h))
        return self.loss_function(self.head(self.norm(h)), labels, self.head.out_features)


def test_patch_swaps_reversibly_and_keeps_the_parameters() -> None:
    torch.manual_seed(0)
    model = _TinyLM()
    ids = torch.randint(0, 32, (2, 9))
    before = model(ids, ids)
    params = {n: p for n, p in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = cnn.patch(model, mlp=True)
    assert report.swapped == {"RMSNorm": 3, "Embedding": 1, "MLP": 2, "loss": 1}, report
    assert "RMSNorm" in str(report) and isinstance(model.norm, cnn.RMSNorm) and isinstance(model.embed, cnn.Embedding)
    assert {n: p for n, p in model.named_parameters()} == params  # the same Parameter objects
    assert model.state_dict().keys() == state.keys()
    torch.testing.assert_close(model(ids, ids), before)
    with pytest.raises(ValueError, match="patched already"):
        cnn.patch(model)
    cnn.unpatch(model)
    assert type(model.norm) is LlamaRMSNorm and type(model.layers[0]["mlp"]) is LlamaMLP
    assert type(model.embed) is nn.Embedding
    assert model.loss_function is _stock_loss and "_loss_function" not in vars(model)
    torch.testing.assert_close(model(ids, ids), before)
    cnn.patch(model)  # patchable again after unpatch


def test_patch_refuses_what_it_cannot_handle() -> None:
    with pytest.raises(TypeError, match="transformers model"):
        cnn.patch(nn.Linear(2, 2))
    model = _TinyLM()
    model.config = type("C", (), {"model_type": "gpt2"})()
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        cnn.patch(model)
    odd = _TinyLM()
    odd.norm.variance_epsilon = None  # not a float: left alone and reported
    report = cnn.patch(odd)
    assert report.swapped["RMSNorm"] == 2 and any("norm" in s for s in report.skipped)


def test_rms_norm_under_compile_picks_the_kernel(monkeypatch) -> None:
    """Compiled, RMSNorm without a gradient is torch's rms_norm (Inductor fuses it), with
    one cuteforge's op ("auto"); "inductor" / "cuteforge" always take the one (the op is
    recorded here, not run)."""
    calls = []
    monkeypatch.setattr("cuteforge.nn.modules._on_cuteforge", lambda x: True)
    monkeypatch.setattr("cuteforge.ops.rms_norm", lambda x, w, eps, residual=None: calls.append(eps) or F.rms_norm(x, (4,), w, eps))
    x = torch.randn(3, 4)
    for mode, grad, want in (("auto", False, 0), ("auto", True, 1), ("inductor", True, 0), ("cuteforge", False, 1)):
        calls.clear()
        torch._dynamo.reset()
        module = cnn.RMSNorm(4, eps=1e-6, under_compile=mode)
        with torch.set_grad_enabled(grad):
            torch.compile(module, backend="eager")(x)
        assert len(calls) == want, (mode, grad)
    with pytest.raises(ValueError, match="under_compile"):
        cnn.RMSNorm(4, under_compile="triton")
    calls.clear()
    monkeypatch.setattr("cuteforge.ops.layer_norm", lambda x, w, b, eps, residual=None: calls.append(eps) or F.layer_norm(x, (4,), w, b))
    for grad, want in ((False, 0), (True, 1)):
        calls.clear()
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            torch.compile(cnn.LayerNorm(4), backend="eager")(x)
        assert len(calls) == want, grad


@pytest.mark.parametrize("padding_idx", [None, 3, -2])
def test_embedding_matches_torch_with_gradients(padding_idx) -> None:
    torch.manual_seed(0)
    weight = torch.randn(50, 8, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 50, (3, 7))
    ids[0, :3] = 48  # padding_idx=-2: a row repeated and padded
    out = cuteforge.ops.embedding(ids, weight, padding_idx)
    grad = torch.randn_like(out)
    (mine,) = torch.autograd.grad(out, weight, grad)
    ref = F.embedding(ids, weight, padding_idx)
    (theirs,) = torch.autograd.grad(ref, weight, grad)
    assert torch.equal(out, ref) and torch.equal(mine, theirs) and mine.dtype == torch.bfloat16


@pytest.mark.parametrize("padding_idx", [-1, 3])
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_embedding_weight_grad_sums_in_fp32(padding_idx, ids_dtype) -> None:
    """The backward's segment sums: fp32 over repeated ids, rounded once, so the gradient
    is exactly the fp32 gradient rounded to bf16 (torch's bf16 accumulation is not);
    nothing at padding_idx; no tokens give zeros."""
    from cuteforge.ops.embedding import weight_grad

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 7), dtype=ids_dtype)
    ids[0, :5] = 3  # one row many times, and the padding row
    ids[1, :3] = 9
    g = torch.randn(3, 7, 8, dtype=torch.bfloat16)
    w32 = torch.zeros(50, 8, requires_grad=True)
    (want,) = torch.autograd.grad(F.embedding(ids, w32, None if padding_idx < 0 else padding_idx), w32, g.float())
    got = weight_grad(g, ids, 50, padding_idx)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert (padding_idx < 0) or not got[padding_idx].any()
    assert torch.equal(weight_grad(g[:0], ids[:0], 50, padding_idx), torch.zeros(50, 8, dtype=torch.bfloat16))


def test_embedding_gradient_under_compile_skips_the_fp32_table() -> None:
    """Compiled, the module's backward sums the tokens' rows in fp32 and writes the table
    in bf16: no fp32 buffer of the table's size, as Inductor's decomposition of torch's
    backward has (an fp32 scatter over a zeroed fp32 table), and no opaque op."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    stock = nn.Embedding(64, 16, padding_idx=0, dtype=torch.bfloat16)
    mine = cnn.Embedding(64, 16, padding_idx=0, dtype=torch.bfloat16)
    mine.weight = stock.weight
    ids = torch.randint(0, 64, (4, 9))

    def step(module):
        torch._dynamo.reset()
        stock.weight.grad = None
        f = torch.compile(lambda i: (module(i).float() ** 2).sum())
        _, code = run_and_get_code(lambda: f(ids).backward())
        return stock.weight.grad.clone(), "\n".join(code)

    want, stock_code = step(stock)
    got, code = step(mine)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    table_fp32 = "(64, 16), (16, 1), torch.float32"
    assert table_fp32 in stock_code and table_fp32 not in code and "cuteforge." not in code
    assert not got[0].any()  # padding_idx
    with pytest.raises(TypeError, match="'ids' has dtype float32; supported: int32, int64"):
        cuteforge.ops.embedding(ids.float(), stock.weight)
    with pytest.raises(ValueError, match="'padding_idx' must be within"):
        cuteforge.ops.embedding(ids, stock.weight, 64)


def test_linear_cross_entropy_math_and_one_backward_kernel_lookup(monkeypatch) -> None:
    """The chunked loss and gradients against torch, with the cross-entropy kernels stood in
    for by torch; the backward kernel is resolved once per chunk layout, not per call."""
    import importlib

    lce = importlib.import_module("cuteforge.ops.linear_cross_entropy")
    launch = importlib.import_module("cuteforge.ops.cross_entropy_launch")
    resolved = []

    def fwd(logits, target, ignore_index, loss):  # the op hands in its (M,) slice of the per-row losses
        lse = logits.float().logsumexp(-1)
        picked = logits.float().gather(1, target.clamp_min(0)[:, None])[:, 0]
        loss.copy_(torch.where(target == ignore_index, 0.0, lse - picked))
        return loss, lse

    def bwd_kernel(logits, target, lse, dloss, dlogits, ignore_index):
        resolved.append(logits.shape)

        def run(lg, t, ls, dl, out):
            g = (lg.float() - ls[:, None]).exp()
            g[torch.arange(len(t)), t.clamp_min(0)] -= 1
            out.copy_(torch.where((t == ignore_index)[:, None], 0.0, g * dl[:, None]))
        return run

    monkeypatch.setattr(lce._ce, "_fwd", fwd)
    monkeypatch.setattr(launch, "_bwd_kernel", bwd_kernel)
    monkeypatch.setattr(launch, "_BWD", {})
    torch.manual_seed(0)
    x, w = torch.randn(300, 16), torch.randn(40, 16)
    t = torch.randint(0, 40, (300,))
    t[::7] = -100
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.cross_entropy(xr @ wr.t(), t)
    ref.backward()
    count = (t != -100).sum()
    for _ in range(2):
        loss, dx, dw = lce._impl(x, w, t, -100, 128, True, True, False)  # the summed loss and its gradients
        torch.testing.assert_close(loss / count, ref.detach())
        torch.testing.assert_close(dx / count, xr.grad)
        torch.testing.assert_close(dw / count, wr.grad)
    assert resolved == [(128, 40), (44, 40)]  # two chunk layouts, each resolved once over both calls

    # through the op's autograd: the incoming gradient (1.5 / rows) applied in the backward
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    (lce._op(xo, wo, t, -100, 128, True, True, False)[0] / count * 1.5).backward()
    xr.grad = wr.grad = None
    (F.cross_entropy(xr @ wr.t(), t) * 1.5).backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(wo.grad, wr.grad)

    # a gradient penalty through dweight: neither path differentiates it (dlogits is not
    # differentiable), so both refuse alike rather than the deferred one returning a wrong answer
    for defer in (False, True):
        xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
        (gw,) = torch.autograd.grad(lce._op(xo, wo, t, -100, 384 if defer else 128, True, True, defer)[0] / count, wo,
                                    create_graph=True)
        assert not gw.requires_grad
        torch.testing.assert_close(gw, wr.grad / 1.5)
    # only x's gradient asked for: the deferred backward skips the dweight GEMM; eager and
    # with the backward formula traced by AOTAutograd
    def deferred(xo, wo):
        return lce._op(xo, wo, t, -100, 384, True, True, True)[0] / count * 1.5

    torch._dynamo.reset()
    for fn in (deferred, torch.compile(deferred, backend="aot_eager", fullgraph=True)):
        xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
        (gx,) = torch.autograd.grad(fn(xo, wo), xo)
        torch.testing.assert_close(gx, xr.grad)
        xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
        gx, gw = torch.autograd.grad(fn(xo, wo), (xo, wo))
        torch.testing.assert_close(gx, xr.grad)
        torch.testing.assert_close(gw, wr.grad)

    # one chunk for the batch: the logits' gradient in dweight's place, dweight made in the backward
    loss, dx, dlogits = lce._impl(x, w, t, -100, 384, True, True, True)
    assert dlogits.shape == (300, 40)
    torch.testing.assert_close(loss / count, ref.detach())
    torch.testing.assert_close(dlogits.t() @ x / count, wr.grad / 1.5)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    (lce._op(xo, wo, t, -100, 384, True, True, True)[0] / count * 1.5).backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(wo.grad, wr.grad)


@pytest.mark.parametrize(("need", "defer"), [((True, True), False), ((True, False), False), ((False, True), False),
                                             ((False, False), False), ((True, True), True), ((False, True), True)])
def test_linear_cross_entropy_plan_unrolls_the_chunks(monkeypatch, need, defer) -> None:
    """The op's C launch plan (`_op_plan`) on the CPU, its kernels stood in for by torch
    behind TVM-FFI: per chunk the logits GEMM, the forward into the chunk's slice of the
    per-row losses, the backward over the logits with the held ones vector, dx's rows and
    dweight's accumulation, then the losses' sum; against torch in fp32."""
    import importlib

    import tvm_ffi

    from cuteforge.native import build

    if build.load() is None:
        pytest.skip("the C++ extension could not be built here")
    lce = importlib.import_module("cuteforge.ops.linear_cross_entropy")
    ignore = -100
    seen = []

    def view(t, dtype=torch.float32):
        # a torch CPU tensor over a TVM-FFI tensor view's memory (the plan's DLTensors live
        # on its stack: no DLPack capsule can outlive the call)
        import ctypes

        shape, strides = tuple(t.shape), tuple(t.strides)
        span = 1 + sum((d - 1) * st for d, st in zip(shape, strides)) if all(shape) else 1
        ptr = t.data_ptr() if callable(t.data_ptr) else t.data_ptr
        raw = (ctypes.c_byte * (span * dtype.itemsize)).from_address(ptr)
        return torch.frombuffer(raw, dtype=dtype).as_strided(shape, strides)

    def fwd(logits, target, loss, lse):
        logits, target, loss, lse = view(logits), view(target, torch.int64), view(loss), view(lse)
        seen.append(("fwd", logits.shape[0]))
        lse.copy_(logits.logsumexp(-1))
        picked = logits.gather(1, target.clamp_min(0)[:, None])[:, 0]
        loss.copy_(torch.where(target == ignore, 0.0, lse - picked))

    def bwd(logits, target, lse, dloss, dlogits):
        logits, target, lse, dloss, dlogits = (view(logits), view(target, torch.int64), view(lse), view(dloss),
                                               view(dlogits))
        seen.append(("bwd", logits.shape[0]))
        g = (logits - lse[:, None]).exp()
        g[torch.arange(len(target)), target.clamp_min(0)] -= 1
        dlogits.copy_(torch.where((target == ignore)[:, None], 0.0, g * dloss[:, None]))

    def total(losses, out):
        view(out).copy_(view(losses).sum(1))

    fns = {name: tvm_ffi.convert(f) for name, f in (("fwd", fwd), ("bwd", bwd), ("sum", total))}
    monkeypatch.setattr(lce._ce, "_fwd_launcher", lambda *a: fns["fwd"])
    monkeypatch.setattr(lce._ce, "_bwd_kernel", lambda *a: fns["bwd"])
    monkeypatch.setattr(lce, "_sum_kernel", lambda t, device: fns["sum"])
    torch.manual_seed(0)
    x, w = torch.randn(300, 16), torch.randn(40, 16)
    t = torch.randint(0, 40, (300,))
    t[::7] = ignore
    # 128-row chunks: three of them, the last short; deferred: one chunk, the logits' gradient in dweight's place
    run = lce._op_plan(x, w, t, ignore, 384 if defer else 128, *need, defer)
    loss, dx, dw = run(x, w, t)
    if defer:
        assert dw.shape == (300, 40)
        dw = dw.t() @ x
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.cross_entropy(xr @ wr.t(), t, reduction="sum")
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    assert loss.shape == ()
    assert dx.shape == ((300, 16) if need[0] else (0,)) and dw.shape == ((40, 16) if need[1] else (0,))
    if need[0]:
        torch.testing.assert_close(dx, xr.grad)
    if need[1]:
        torch.testing.assert_close(dw, wr.grad)
    grads = need[0] or need[1]
    if defer:
        assert seen == [("fwd", 300), ("bwd", 300)]
    else:
        assert seen == [("fwd", 128)] + [("bwd", 128)] * grads + [("fwd", 128)] + [("bwd", 128)] * grads + \
            [("fwd", 44)] + [("bwd", 44)] * grads
    strided = torch.zeros(600, dtype=torch.int64)[::2]
    assert lce._op_plan(x, w, strided, ignore, 128, *need, False) is None  # `_impl` copies it first
    assert lce._op_plan(x[:0], w, t[:0], ignore, 128, *need, False) is None  # an empty batch: the Python body


def test_linear_cross_entropy_takes_autocast_dtype() -> None:
    """Under autocast (fp32 master weights, bf16 compute) x and the LM head's weight reach
    the op in autocast's dtype, as the stock head's F.linear takes them, instead of the
    op's one-dtype check refusing them; gradients flow back to the fp32 tensors."""
    import importlib

    lce = importlib.import_module("cuteforge.ops.linear_cross_entropy")
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(10, 8, requires_grad=True)
    assert lce._autocast_operands(x, w) == (x, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xa, wa = lce._autocast_operands(x, w)
        assert xa.dtype == wa.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="'x' must be a CUDA tensor"):  # past the dtype check
            lce.linear_cross_entropy(x, w, torch.zeros(4, dtype=torch.int64))
    (xa.float().sum() + wa.float().sum()).backward()
    assert x.grad.dtype == w.grad.dtype == torch.float32


def test_linear_cross_entropy_chunks_and_checks() -> None:
    import importlib

    lce = importlib.import_module("cuteforge.ops.linear_cross_entropy")
    assert lce.chunk_rows(4096, 128256, 2) == 2048  # 512 MiB of bf16 logits a chunk, two balanced chunks
    assert lce.chunk_rows(7, 128256, 2) == 7
    assert lce.chunk_rows(5000, 32000, 4) % 128 == 0
    assert lce.chunk_rows(0, 128256, 2) == 1  # an empty batch: one (empty) chunk, no division by zero
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    # the batch's logits no larger than the weight (1 GiB): one chunk, dweight deferred
    assert lce.chunking(4096, 128256, 4096, bf16, True) == (4096, True)
    assert lce.chunking(2048, 128256, 1024, bf16, True) == (2048, True)  # within the 512 MiB budget
    # anything else keeps the 512 MiB chunks: no larger forward peak where nothing is deferred
    assert lce.chunking(8192, 128256, 4096, bf16, True) == (2048, False)  # logits larger than the weight
    assert lce.chunking(4096, 128256, 4096, bf16, False) == (2048, False)  # a frozen head
    assert lce.chunking(4096, 128256, 4096, fp16, True) == (2048, False)
    assert lce.chunking(4096, 128256, 4096, fp32, True) == (4096, True)  # 2 GiB of fp32 logits, a 2 GiB weight
    assert lce.chunking(8192, 128256, 4096, fp32, True) == (1024, False)
    assert lce.chunking(0, 128256, 4096, bf16, True) == (1, False)
    assert lce.defers_dw(4096, 4096, torch.bfloat16, True) and lce.defers_dw(7, 7, torch.float32, True)
    assert not lce.defers_dw(4096, 2048, torch.bfloat16, True)  # two chunks: dweight accumulates in the forward
    assert not lce.defers_dw(7, 7, torch.float16, True)  # x / rows would be subnormal in fp16
    assert not lce.defers_dw(7, 7, torch.bfloat16, False) and not lce.defers_dw(0, 1, torch.bfloat16, True)
    xs, ws, ts = torch.randn(300, 8), torch.randn(10, 8), torch.zeros(300, dtype=torch.int64)
    for bad in (0, 100):  # chunks off the 128-row tiles would hand the kernels misaligned slices
        with pytest.raises(ValueError, match="argument 'chunk' must be a multiple of 128"):
            lce._impl(xs, ws, ts, -100, bad, True, True, False)
    with pytest.raises(ValueError, match="argument 'defer_dw' needs"):  # two chunks cannot defer dweight
        lce._impl(xs, ws, ts, -100, 128, True, True, True)
    x, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="'weight' has 9 columns"):
        lce.linear_cross_entropy(x, torch.randn(10, 9), t)
    with pytest.raises(TypeError, match="share one of"):
        lce.linear_cross_entropy(x, w.double(), t)
    with pytest.raises(ValueError, match="reduction"):
        lce.linear_cross_entropy(x, w, t, reduction="none")
    with pytest.raises(ValueError, match="'x' must be a CUDA tensor"):
        lce.linear_cross_entropy(x, w, t)
