"""The actor's and the critic's MLPs as fused Triton kernels: the update's
bfloat16 path with `PPOConfig.fused_mlp` (`mlp`).

A network of two tanh hidden layers, ``features -> H1 -> H2 -> out``
(``out`` 1 or 2), runs in two kernels a minibatch instead of some twenty
Torch kernels and passes over its [B, H] activations:

- forward, a program per ``BLOCK_M`` rows: both hidden layers' matrix
  products, their biases and tanh, and the output layer, the first hidden
  layer kept on chip while the second is computed; it writes the two
  hidden activations (bfloat16, for the backward) and the output (float32);
- backward, a program per ``BLOCK_M`` rows and ``BLOCK_J`` of the first
  hidden layer's columns: the output's gradient through the output layer
  and both tanh (each activation's derivative ``1 - h²`` applied where the
  product that needs it is computed), writing the two hidden layers'
  pre-activation gradients (bfloat16) and each row block's sums of the
  bias and output-weight gradients (float32); the two hidden weight
  gradients are then two matrix products (Torch's).

Roundings, against Torch's autocast to bfloat16 (`matmul_precision`
``"bf16"``): the same bfloat16 inputs of every product (features, weights,
biases, activations) with float32 accumulation; the hidden activations
rounded once to bfloat16, as there; the output, the output layer's
gradients and the bias gradients kept in float32 (autocast rounds them to
bfloat16); tanh from ``exp`` (within a few float32 ulps of Torch's). So
other numbers than the unfused bf16 path, stated here and in the PPO
page; the learning gates are their proof.

The kernels run on CUDA tensors, and on CPU tensors under
``TRITON_INTERPRET=1`` (set before Triton is imported): the tests' path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import nn

__all__ = ["BLOCK_M", "fusable", "mlp", "runs_on"]

#: Rows a program takes (forward and backward).
BLOCK_M = 64
#: Columns of the second hidden layer a step of a program's loop takes.
BLOCK_N = 32
#: Features a step of the forward's first loop takes.
BLOCK_K = 32
#: Columns of the first hidden layer a backward program takes (the rest: other programs).
BLOCK_J = 64
#: Warps a program runs.
NUM_WARPS = 8
#: The hidden widths the kernels take: powers of two in this range.
MIN_WIDTH, MAX_WIDTH = 16, 256
#: The most features the kernels take.
MAX_FEATURES = 256

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_on(device: torch.device) -> bool:
    """Whether the kernels run on tensors of ``device``: CUDA, or any under the interpreter."""
    return device.type == "cuda" or _INTERPRET


def fusable(net: nn.Module, features: int) -> bool:
    """Whether ``net`` is what the kernels compute: Linear, Tanh, Linear,
    Tanh, Linear, on ``features`` inputs, with biases, its hidden widths
    powers of two in [16, 256] and one or two outputs."""
    layers = list(net.children()) if isinstance(net, nn.Sequential) else []
    if len(layers) != 5 or not all(isinstance(layers[i], nn.Linear) and layers[i].bias is not None
                                   for i in (0, 2, 4)):
        return False
    if not all(type(layers[i]) is nn.Tanh for i in (1, 3)):
        return False
    first, second, last = layers[0], layers[2], layers[4]
    widths = (first.out_features, second.out_features)
    return (first.in_features == features and 1 <= features <= MAX_FEATURES
            and second.in_features == widths[0] and last.in_features == widths[1]
            and all(MIN_WIDTH <= w <= MAX_WIDTH and w & (w - 1) == 0 for w in widths)
            and last.out_features in (1, 2))


def mlp(net: nn.Sequential, z: torch.Tensor) -> torch.Tensor:
    """``net``'s output [B, out] (float32) on ``z`` [B, features] (float32)
    through the fused kernels (`fusable` must hold; the layers' weights
    and biases get gradients, ``z`` none).

    Raises:
        ValueError: a ``z`` that is not [B, features] floating point, or
            that requires a gradient; a ``net`` the kernels do not compute
            on ``z``'s features (`fusable`).
    """
    if z.dim() != 2 or not z.is_floating_point():
        raise ValueError(f"z must be floating point [B, features], got {z.dtype} {list(z.shape)}")
    if not fusable(net, z.shape[1]):
        raise ValueError(f"net must be Linear, Tanh, Linear, Tanh, Linear on z's {z.shape[1]} features, with "
                         f"biases, hidden widths powers of two in [{MIN_WIDTH}, {MAX_WIDTH}] and 1 or 2 outputs")
    if z.requires_grad:
        raise ValueError("z must not require a gradient: the fused kernels give none to their input")
    first, _, second, _, last = net.children()
    return _FusedMLP.apply(z, first.weight, first.bias, second.weight, second.bias, last.weight, last.bias)


class _FusedMLP(torch.autograd.Function):
    """The forward and backward kernels as one autograd node."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        z = z.contiguous().float()
        w1, b1, w2, b2, w3, b3 = (p.detach().to(torch.bfloat16).contiguous() for p in params)
        rows, features = z.shape
        chunk = min(BLOCK_K, max(16, triton.next_power_of_2(features)))
        w1t = w1.new_zeros(triton.cdiv(features, chunk) * chunk, w1.shape[0])  # W1^T, zero rows past the features
        w1t[:features] = w1.t()
        h1 = z.new_empty(rows, w1.shape[0], dtype=torch.bfloat16)
        h2 = z.new_empty(rows, w2.shape[0], dtype=torch.bfloat16)
        out = z.new_empty(rows, w3.shape[0])
        if rows:
            _forward_kernel[(triton.cdiv(rows, BLOCK_M),)](
                z, w1t, b1, w2.t().contiguous(), b2, w3, b3, h1, h2, out, rows, features,
                BLOCK_M=BLOCK_M, BLOCK_F=w1t.shape[0], BLOCK_K=chunk, H1=w1.shape[0],
                H2=w2.shape[0], BLOCK_N=min(BLOCK_N, w2.shape[0]), OUT=w3.shape[0], INTERPRET=_INTERPRET,
                num_warps=NUM_WARPS)
        ctx.save_for_backward(z, w2, w3, h1, h2)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, w2, w3, h1, h2 = ctx.saved_tensors
        grad = grad.contiguous().float()
        rows, (width1, width2, outputs) = z.shape[0], (h1.shape[1], h2.shape[1], w3.shape[0])
        programs = triton.cdiv(rows, BLOCK_M)
        dz1, dz2 = torch.empty_like(h1), torch.empty_like(h2)
        db1 = z.new_zeros(max(programs, 1), width1)
        db2 = z.new_zeros(max(programs, 1), width2)
        dw3 = z.new_zeros(max(programs, 1), outputs, width2)
        if rows:
            split = min(BLOCK_J, width1)
            _backward_kernel[(programs, width1 // split)](
                grad, w2, w3, h1, h2, dz1, dz2, db1, db2, dw3, rows,
                BLOCK_M=BLOCK_M, BLOCK_J=split, H1=width1, H2=width2, BLOCK_N=min(BLOCK_N, width2), OUT=outputs,
                INTERPRET=_INTERPRET, num_warps=NUM_WARPS)
        with torch.autocast(z.device.type, enabled=False):
            dw1 = dz1.t().mm(z.to(torch.bfloat16)).float()
            dw2 = dz2.t().mm(h1).float()
        return None, dw1, db1.sum(0), dw2, db2.sum(0), dw3.sum(0), grad.sum(0)


@triton.jit
def _tanh(x):
    """tanh in float32: a Taylor polynomial below 0.1 in magnitude (where
    ``1 - e^-2|x|`` would cancel), ``(1 - e^-2|x|) / (1 + e^-2|x|)`` above."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    s = x * x
    near = a * (1.0 + s * (-1.0 / 3.0 + s * (2.0 / 15.0 + s * (-17.0 / 315.0))))
    return tl.where(x < 0.0, -1.0, 1.0) * tl.where(a < 0.1, near, far)


@triton.jit
def _bf16(x):
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), as
    bfloat16: done on the bits, so that Triton's interpreter (whose cast
    truncates) rounds as the GPU does. A NaN stays NaN (its bits would
    carry into the sign: the GPU's NaN is 0x7FFFFFFF)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x).to(tl.bfloat16)


@triton.jit
def _dot(a, b, INTERPRET: tl.constexpr):
    """``a @ b`` of two bfloat16 tiles, accumulated in float32 (on the
    interpreter, whose product of bfloat16 tiles multiplies their bits, in
    float32 on the same values)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _forward_kernel(z_ptr, w1t_ptr, b1_ptr, w2t_ptr, b2_ptr, w3_ptr, b3_ptr, h1_ptr, h2_ptr, out_ptr,
                    rows, features,
                    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, H1: tl.constexpr,
                    H2: tl.constexpr, BLOCK_N: tl.constexpr, OUT: tl.constexpr, INTERPRET: tl.constexpr):
    # w1t: W1^T [BLOCK_F, H1] (zero rows past the features), w2t: W2^T [H1, H2], both contiguous.
    r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit offsets: any row count
    live = r < rows
    j = tl.arange(0, H1)
    n = tl.arange(0, BLOCK_N)
    a1 = tl.zeros([BLOCK_M, H1], tl.float32) + tl.load(b1_ptr + j).to(tl.float32)[None, :]
    for k in tl.range(BLOCK_F // BLOCK_K):  # the features in chunks: small tiles on chip
        f = k * BLOCK_K + tl.arange(0, BLOCK_K)
        z = tl.load(z_ptr + r[:, None] * features + f[None, :], mask=live[:, None] & (f[None, :] < features),
                    other=0.0)
        a1 += _dot(_bf16(z), tl.load(w1t_ptr + f[:, None] * H1 + j[None, :]), INTERPRET)
    h1 = _bf16(_tanh(a1))
    tl.store(h1_ptr + r[:, None] * H1 + j[None, :], h1, mask=live[:, None])
    out0 = tl.zeros([BLOCK_M], tl.float32)
    out1 = tl.zeros([BLOCK_M], tl.float32)
    for c in tl.range(H2 // BLOCK_N):
        cols = c * BLOCK_N + n
        a2 = _dot(h1, tl.load(w2t_ptr + j[:, None] * H2 + cols[None, :]), INTERPRET)
        h2 = _bf16(_tanh(a2 + tl.load(b2_ptr + cols).to(tl.float32)[None, :]))
        tl.store(h2_ptr + r[:, None] * H2 + cols[None, :], h2, mask=live[:, None])
        h2 = h2.to(tl.float32)
        out0 += tl.sum(h2 * tl.load(w3_ptr + cols).to(tl.float32)[None, :], axis=1)
        if OUT == 2:
            out1 += tl.sum(h2 * tl.load(w3_ptr + H2 + cols).to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + r * OUT, out0 + tl.load(b3_ptr).to(tl.float32), mask=live)
    if OUT == 2:
        tl.store(out_ptr + r * OUT + 1, out1 + tl.load(b3_ptr + 1).to(tl.float32), mask=live)


@triton.jit
def _backward_kernel(g_ptr, w2_ptr, w3_ptr, h1_ptr, h2_ptr, dz1_ptr, dz2_ptr, db1_ptr, db2_ptr, dw3_ptr, rows,
                     BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr,
                     BLOCK_N: tl.constexpr, OUT: tl.constexpr, INTERPRET: tl.constexpr):
    # A program takes BLOCK_M rows and BLOCK_J of the first hidden layer's
    # H1 columns; each recomputes its rows' second-layer gradient, and the
    # first of a row block's programs writes it and its sums.
    program = tl.program_id(0).to(tl.int64)  # 64-bit offsets: any row count
    r = program * BLOCK_M + tl.arange(0, BLOCK_M)
    live = r < rows
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    n = tl.arange(0, BLOCK_N)
    first = (n * 0 + tl.program_id(1)) == 0  # [BLOCK_N]: whether this program writes the second layer's part
    g0 = tl.load(g_ptr + r * OUT, mask=live, other=0.0)
    g1 = tl.zeros([BLOCK_M], tl.float32)
    if OUT == 2:
        g1 = tl.load(g_ptr + r * OUT + 1, mask=live, other=0.0)
    dh1 = tl.zeros([BLOCK_M, BLOCK_J], tl.float32)
    for c in tl.range(H2 // BLOCK_N):
        cols = c * BLOCK_N + n
        h2 = tl.load(h2_ptr + r[:, None] * H2 + cols[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        dh2 = g0[:, None] * tl.load(w3_ptr + cols).to(tl.float32)[None, :]
        tl.store(dw3_ptr + program * OUT * H2 + cols, tl.sum(g0[:, None] * h2, axis=0), mask=first)
        if OUT == 2:
            dh2 += g1[:, None] * tl.load(w3_ptr + H2 + cols).to(tl.float32)[None, :]
            tl.store(dw3_ptr + program * OUT * H2 + H2 + cols, tl.sum(g1[:, None] * h2, axis=0), mask=first)
        dz2 = _bf16(dh2 * (1.0 - h2 * h2))
        tl.store(dz2_ptr + r[:, None] * H2 + cols[None, :], dz2, mask=live[:, None] & first[None, :])
        tl.store(db2_ptr + program * H2 + cols, tl.sum(dz2.to(tl.float32), axis=0), mask=first)
        dh1 += _dot(dz2, tl.load(w2_ptr + cols[:, None] * H1 + j[None, :]), INTERPRET)  # W2[cols, j]
    h1 = tl.load(h1_ptr + r[:, None] * H1 + j[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    dz1 = _bf16(dh1 * (1.0 - h1 * h1))
    tl.store(dz1_ptr + r[:, None] * H1 + j[None, :], dz1, mask=live[:, None])
    tl.store(db1_ptr + program * H1 + j, tl.sum(dz1.to(tl.float32), axis=0))
