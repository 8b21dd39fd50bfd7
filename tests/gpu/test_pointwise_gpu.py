"""The pointwise ops on the GPU against torch: `ops.silu_mul` against F.silu(gate) * up and
`ops.rotary_embedding` against transformers' apply_rotary_pos_emb, forward and backward,
at odd shapes, every dtype, strided and misaligned views; then a Llama patched by default
(MLP activation and rotary on cuteforge) against the same model unpatched."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import cuteforge.nn as cnn
from cuteforge import ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _silu_mul_fp64(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate.double()) * up.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (1000, 1000), (3, 65537), (4097, 1000), (2, 5, 4099)])
def test_silu_mul_matches_torch_with_gradients(dtype, shape) -> None:
    torch.manual_seed(0)
    gate = (3 * torch.randn(shape, device="cuda")).to(dtype).requires_grad_()
    up = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    out = ops.silu_mul(gate, up)
    ref_gate, ref_up = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    ref = _silu_mul_fp64(ref_gate, ref_up)
    assert out.dtype == dtype and out.shape == gate.shape
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn_like(out)
    dgate, dup = torch.autograd.grad(out, (gate, up), grad)
    rgate, rup = torch.autograd.grad(ref, (ref_gate, ref_up), grad.double())
    assert _rel(dgate, rgate) < TOL[dtype] and _rel(dup, rup) < TOL[dtype]
    if dtype != torch.float32:  # torch rounds twice in 16 bits, ours once: no worse
        assert _rel(out, ref) <= _rel(F.silu(gate.detach()) * up.detach(), ref) * 1.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul_reads_strided_and_misaligned_views(dtype) -> None:
    torch.manual_seed(0)
    base = torch.randn(64, 2 * 1003 + 1, device="cuda", dtype=dtype)
    gate, up = base[:, 1:1004], base[:, 1004:]  # rows of 1003 at odd offsets, row stride 2007
    out = ops.silu_mul(gate, up)
    assert _rel(out, _silu_mul_fp64(gate, up)) < TOL[dtype]
    t = torch.randn(8, 6, 1024, device="cuda", dtype=dtype).transpose(0, 1)  # leading dims that do not flatten
    assert _rel(ops.silu_mul(t, t), _silu_mul_fp64(t, t)) < TOL[dtype]
    assert ops.silu_mul(t[:0], t[:0]).shape == (0, 8, 1024)


def _rotary_fp64(q, k, cos, sin, unsqueeze_dim):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim)


def _rope(b: int, s: int, d: int, dtype: torch.dtype, batch_cos: bool = True):
    pos = torch.arange(s, device="cuda", dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)
    if batch_cos:
        cos, sin = cos.expand(b, s, d).contiguous(), sin.expand(b, s, d).contiguous()
    return cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b, hq, hk, s, d", [(1, 1, 1, 1, 64), (2, 4, 2, 7, 128), (1, 32, 8, 1000, 128),
                                             (3, 5, 5, 17, 96), (2, 3, 1, 9, 2), (1, 2, 2, 4097, 256)])
def test_rotary_matches_transformers_with_gradients(dtype, b, hq, hk, s, d) -> None:
    torch.manual_seed(0)
    # (B, H, S, D) views of (B, S, H, D) projections, as Llama's attention hands them over
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
    cos, sin = _rope(b, s, d, dtype, batch_cos=b % 2 == 0)
    qo, ko = ops.rotary_embedding(q, k, cos, sin)
    ref_q, ref_k = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = _rotary_fp64(ref_q, ref_k, cos, sin, 1)
    assert qo.stride() == q.stride() and ko.stride() == k.stride()
    assert _rel(qo, rq) < TOL[dtype] and _rel(ko, rk) < TOL[dtype]
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    rdq, rdk = torch.autograd.grad((rq, rk), (ref_q, ref_k), (gq.double(), gk.double()))
    assert _rel(dq, rdq) < TOL[dtype] and _rel(dk, rdk) < TOL[dtype]


def test_rotary_takes_the_other_layout_unequal_halves_and_one_gradient() -> None:
    torch.manual_seed(0)
    dtype = torch.bfloat16
    q = torch.randn(2, 33, 6, 64, device="cuda", dtype=dtype, requires_grad=True)  # (B, S, H, D)
    k = torch.randn(2, 33, 2, 64, device="cuda", dtype=dtype, requires_grad=True)
    cos = torch.randn(1, 33, 64, device="cuda", dtype=dtype)  # halves unlike each other: the general rotation
    sin = torch.randn(1, 33, 64, device="cuda", dtype=dtype)
    qo, ko = ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim=2)
    ref_q, ref_k = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = _rotary_fp64(ref_q, ref_k, cos, sin, 2)
    assert _rel(qo, rq) < 1e-2 and _rel(ko, rk) < 1e-2
    (dq,) = torch.autograd.grad(qo.float().square().sum(), (q,))  # k's output unused: a None gradient
    (rdq,) = torch.autograd.grad(rq.square().sum(), (ref_q,))
    assert _rel(dq, rdq) < 1e-2


def test_patched_llama_with_rotary_and_mlp_activation_trains_like_stock() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched)
    assert report.swapped.get("rotary embedding") == 1 and report.swapped.get("MLP") == 2, str(report)
    ids = torch.randint(0, 1000, (2, 129), device="cuda")
    loss = stock(input_ids=ids, labels=ids).loss
    loss.backward()
    got = patched(input_ids=ids, labels=ids).loss
    got.backward()
    assert abs(got.item() - loss.item()) < 2e-2 * abs(loss.item())
    for (name, a), b in zip(stock.named_parameters(), patched.parameters()):
        assert _rel(b.grad, a.grad) < 2e-2, name
    cnn.unpatch(patched)
