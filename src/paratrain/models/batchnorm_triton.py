"""Training-mode BatchNorm (and the ReLU6 / ReLU after it) as Triton kernels over channels_last
tensors (model.batchnorm=triton).

MobileNetV2 at 500x500 input spends most of its step in BatchNorm: 36 layers whose inputs reach
64 x 96 x 250 x 250. Each is a pass over memory with nothing to compute, and in channels_last
the statistics are sums down the columns of an [N*H*W, C] matrix with few columns (16 to 144
at the largest sides), which inductor's generated reductions read at a fraction of the GPU's
bandwidth (1.1 TB/s of 4.8 on an H200: benchmarks/results/2026-12-03-h200x1/issue34/). These kernels read that matrix as rows of
lcm(C, 128) elements (_wide), 128 contiguous lanes a block, each lane keeping one channel; each
program sums its share of the rows into one row of partial sums per lane; torch adds the
programs' rows and a channel's lanes, and one small kernel works out the per-channel terms
from the sums (as torch arithmetic those were ~15 launches a layer each way: 3 ms of a 39 ms
step in CUDA graphs, in the same profile):

- forward: the statistics (one read), then y = act(x * scale + shift) (one read, one write);
- backward: the sums of the gradient and of gradient x (x - mean) over each channel, the
  activation's mask recomputed from x (one read of each), then the input gradient, an affine
  function of the two per channel (one read of each, one write).

The activation comes inside the same kernels, so its input is never stored. Statistics are fp32
(sums taken from each channel's first value, against cancellation), the output in x's dtype,
as PyTorch's BatchNorm under autocast. The running statistics update as nn.BatchNorm2d's
(momentum, unbiased variance). Eval mode, and BatchNorm layers of other settings (no affine, no
running statistics, cumulative momentum), are nn.BatchNorm2d's own code. Without CUDA (and
without TRITON_INTERPRET=1, Triton's CPU interpreter the tests use) the ops are the same
arithmetic in torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.kernels import big, block_index, tl, triton, uses_triton
from paratrain.models.swap import swap_modules

NONE, RELU, RELU6 = 0, 1, 2  # the activation after the normalisation

if triton is not None:

    @triton.jit
    def _act_mask(z, ACT: tl.constexpr):
        """Where the activation passes its gradient (its derivative, 0 or 1)."""
        passes = z == z
        if ACT == 1:
            passes = z > 0
        if ACT == 2:
            passes = (z > 0) & (z < 6)
        return passes

    @triton.jit
    def _lanes(LANES: tl.constexpr, k, C):
        """Block k's positions in a row of the wide view (_wide) and their channels."""
        lane = k * LANES + tl.arange(0, LANES)
        return lane, lane % C

    @triton.jit
    def _col_sums(
        x, g, weight, bias, mean, invstd, part, T, C, W, blocks,
        ACT: tl.constexpr, GRAD: tl.constexpr, BLOCK_R: tl.constexpr, LANES: tl.constexpr,
        BIG: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr,
    ):  # fmt: skip
        """Each program's sums over its row blocks of the wide view (_wide) for lane block
        program_id(1), per lane (the lanes of one channel are added after, in torch), UNROLL
        consecutive blocks a turn of its loop (their loads independent of each other, so more
        bytes in flight per thread).
        GRAD=False: sum(x - s), sum((x - s)^2) with s = x's first row (each channel's first
        value). GRAD=True: g's sum and sum(g * (x - mean)), g masked by the activation at
        z = x * scale + shift (scale and shift from the forward's mean and invstd).
        STAGES > 1: Triton pipelines the loop's loads (through shared memory, cp.async on sm_90),
        the next turns' bytes in flight while this turn's are summed."""
        lane, ch = _lanes(LANES, tl.program_id(1), C)
        if GRAD:
            s = tl.load(mean + ch)
            scale = tl.load(weight + ch).to(tl.float32) * tl.load(invstd + ch)
            shift = tl.load(bias + ch).to(tl.float32) - s * scale
        else:
            s = tl.load(x + ch).to(tl.float32)
        # one accumulator element a thread's element: summed across threads once, at the end
        first = tl.zeros([BLOCK_R, LANES], dtype=tl.float32)
        second = tl.zeros([BLOCK_R, LANES], dtype=tl.float32)
        turns = tl.cdiv(blocks, UNROLL)
        for turn in tl.range(tl.program_id(0), turns, tl.num_programs(0), num_stages=STAGES):
            for u in tl.static_range(UNROLL):
                r = block_index((turn * UNROLL + u) * BLOCK_R, BLOCK_R, BIG)
                at = r[:, None] * W + lane[None, :]
                m = at < T
                v = tl.load(x + at, m, 0.0).to(tl.float32)
                d = tl.where(m, v - s[None, :], 0.0)
                if GRAD:
                    gv = tl.load(g + at, m, 0.0).to(tl.float32)
                    z = v * scale[None, :] + shift[None, :]
                    gv = tl.where(_act_mask(z, ACT), gv, 0.0)
                    first += gv
                    second += gv * d
                else:
                    first += d
                    second += d * d
        out = part + tl.program_id(0) * 2 * W + lane
        tl.store(out, tl.sum(first, 0))
        tl.store(out + W, tl.sum(second, 0))

    @triton.jit
    def _finish_stats(
        x, sums, weight, bias, mean, invstd, coef, C, count, eps, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        """The forward's statistics from the column sums [2, C], in one launch (torch's
        arithmetic for them took ~15 small kernels a layer): mean, invstd and _affine's
        [scale, shift]."""
        c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        sum_d, sum_dd = tl.load(sums + c, cm, 0.0), tl.load(sums + C + c, cm, 0.0)
        centred = sum_d / count  # mean - first
        mu = tl.load(x + c, cm, 0.0).to(tl.float32) + centred
        inv = tl.rsqrt(tl.maximum(sum_dd / count - centred * centred, 0.0) + eps)
        scale = tl.load(weight + c, cm, 0.0).to(tl.float32) * inv
        tl.store(mean + c, mu, cm)
        tl.store(invstd + c, inv, cm)
        tl.store(coef + c, scale, cm)
        tl.store(coef + C + c, tl.load(bias + c, cm, 0.0).to(tl.float32) - mu * scale, cm)

    @triton.jit
    def _finish_grad(
        sums, weight, bias, mean, invstd, coef, dweight, dbias, C, count, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        """The backward's per-channel terms from the column sums [2, C], in one launch: the weight
        and bias gradients and _affine's [scale, shift, k1, k2, k3], with
        dx = scale * (g - mean(g) - xhat * mean(g * xhat)) = k1 * g + k2 * x + k3."""
        c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        sum_g, sum_gx = tl.load(sums + c, cm, 0.0), tl.load(sums + C + c, cm, 0.0)
        mu = tl.load(mean + c, cm, 0.0)
        inv = tl.load(invstd + c, cm, 0.0)
        scale = tl.load(weight + c, cm, 0.0).to(tl.float32) * inv
        k2 = -scale * inv * inv * sum_gx / count
        tl.store(coef + c, scale, cm)
        tl.store(coef + C + c, tl.load(bias + c, cm, 0.0).to(tl.float32) - mu * scale, cm)
        tl.store(coef + 2 * C + c, scale, cm)
        tl.store(coef + 3 * C + c, k2, cm)
        tl.store(coef + 4 * C + c, -scale * sum_g / count - k2 * mu, cm)
        tl.store(dweight + c, sum_gx * inv, cm)
        tl.store(dbias + c, sum_g, cm)

    @triton.jit
    def _affine(
        x, g, coef, y, T, C, W, chunks,
        ACT: tl.constexpr, GRAD: tl.constexpr, BLOCK_R: tl.constexpr, LANES: tl.constexpr,
        BIG: tl.constexpr,
    ):  # fmt: skip
        """GRAD=False: y = act(x * a + b), coef = [a, b]. GRAD=True: the input gradient
        y = k1 * g' + k2 * x + k3 with g' the activation-masked g (mask at x * a + b),
        coef = [a, b, k1, k2, k3]. A block of the wide view (_wide) a program, one grid axis
        with a row block's lane blocks consecutive: they run together and read one stretch of
        memory together."""
        lane, ch = _lanes(LANES, tl.program_id(0) % chunks, C)
        r = block_index(tl.program_id(0) // chunks * BLOCK_R, BLOCK_R, BIG)
        at = r[:, None] * W + lane[None, :]
        m = at < T
        v = tl.load(x + at, m, 0.0).to(tl.float32)
        z = v * tl.load(coef + ch)[None, :] + tl.load(coef + C + ch)[None, :]
        if GRAD:
            gv = tl.load(g + at, m, 0.0).to(tl.float32)
            gv = tl.where(_act_mask(z, ACT), gv, 0.0)
            k1 = tl.load(coef + 2 * C + ch)[None, :]
            k2 = tl.load(coef + 3 * C + ch)[None, :]
            k3 = tl.load(coef + 4 * C + ch)[None, :]
            out = k1 * gv + k2 * v + k3
        else:
            out = z
            if ACT == 1:
                out = tl.maximum(out, 0.0)
            if ACT == 2:
                out = tl.minimum(tl.maximum(out, 0.0), 6.0)
        tl.store(y + at, out.to(y.dtype.element_ty), m)


def _uses_triton(x: torch.Tensor) -> bool:
    """The kernels (fp32 statistics) where they run (kernels.uses_triton); torch's
    arithmetic for float64 (its statistics in float64, as the fake says)."""
    return x.dtype != torch.float64 and uses_triton(x)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (N, C, H, W) as the [N*H*W, C] matrix of its channels_last layout (copied if not)."""
    return (
        x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(-1, x.shape[1])
    )


def _like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


# The [P, C] matrix read as rows of W = lcm(C, 128) elements (_wide): every block of 128 lanes is
# a contiguous 256-byte stretch of each of its rows, whatever C is, and each lane keeps one
# channel, (k * 128 + j) % C. Blocks of channels instead (a [rows, C] tile split at powers of
# two) left lanes masked or rows cut into narrow pieces: at C = 144, blocks of 128 + 128 (16
# used) or 9 x 16 (32-byte pieces); the 144-channel layers' elementwise pass moved 3.0 TB/s
# either way against 4.1-4.7 at 32 and 96 channels (calls 23 and 25, 2026-12-03).
LANES, BLOCK_R = 128, 16  # 2,048 elements a block (~70 registers on sm_90; 8,192 took all 255)


def _wide(x2: torch.Tensor) -> tuple[int, int, int, int]:
    """-> (T elements, W elements a wide row, wide rows, lane blocks a row)."""
    p, c = x2.shape
    w = c * LANES // math.gcd(c, LANES)
    return p * c, w, triton.cdiv(p * c, w), w // LANES


def _big(x2: torch.Tensor, w: int, unroll: int = 1, block_r: int = BLOCK_R) -> bool:
    """int64 offsets (kernels.big) where the blocks past the end (a loop turn's, up to
    unroll + 1 row blocks of W) would reach 2**31: W is up to 128 C."""
    return big(x2) or x2.numel() + (unroll + 1) * block_r * w >= 2**31


# _col_sums' grid and loop, as measured on the H200 (2026-12-03, benchmarks/results/2026-12-03-h200x1/issue34/: colsums_sweep.py over every MobileNetV2 layer, 13 choices, kernel time a step 6.06 ms
# at call 26's rule, 5.31 at this one, 5.05 at each layer's best). A layer of COL_SUMS_PIPELINED_
# BYTES or more: 2 blocks a turn, Triton pipelining the loop's loads 3 stages deep, on 528
# programs in all from COL_SUMS_BIG_BYTES up (the grid resident at once) and 264 per lane block
# below. A smaller one: 132 programs per lane block of 8 warps, blocks of 32 wide rows, 4 a turn
# (fewer, fuller programs: on those layers' 5-75 MB the pipelined choice read 0.2-1.4 TB/s,
# this one 0.4-1.5).
COL_SUMS_PROGRAMS, COL_SUMS_SMALL_PROGRAMS = 528, 264
COL_SUMS_BIG_BYTES, COL_SUMS_PIPELINED_BYTES = 10**8, 4 * 10**7
COL_SUMS_PIPELINED = (2, BLOCK_R, 4, 3)  # (blocks a turn, wide rows a block, warps, stages)
COL_SUMS_SMALL = (132, 4, 32, 8, 1)  # (programs per lane block, then as above)


def _column_sums(
    x2, g2, stats, act: int, programs=0, unroll=0, rows=0, warps=0, stages=0
) -> torch.Tensor:
    """-> [2, C] fp32: the two sums of _col_sums over all rows; stats = (weight, bias, mean,
    invstd) in the backward, None in the forward. programs / unroll / rows / warps / stages:
    the grid's programs per lane block, blocks a turn, wide rows a block, warps a program,
    the loop's pipeline stages (0: _col_sums_choice's; benchmarks/device/colsums_sweep.py
    times others)."""
    c = x2.shape[1]
    t, w, wide_rows, chunks = _wide(x2)
    rule = _col_sums_choice(x2, chunks)
    most, unroll, block_r, warps, stages = (
        given or default
        for given, default in zip((programs, unroll, rows, warps, stages), rule, strict=True)
    )
    blocks = triton.cdiv(wide_rows, block_r)
    programs = min(triton.cdiv(blocks, unroll), most)
    part = torch.empty((programs, 2, w), dtype=torch.float32, device=x2.device)
    _col_sums[(programs, chunks)](
        x2, x2 if g2 is None else g2, *(stats or (x2,) * 4), part, t, c, w, blocks,
        ACT=act, GRAD=g2 is not None, BLOCK_R=block_r, LANES=LANES,
        BIG=_big(x2, w, unroll, block_r), UNROLL=unroll, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    # one torch reduction adds the programs' rows and a channel's lanes (9 us a layer on the
    # H200; a loop over the rows in the _finish kernel, one program per 128 channels, took
    # 60-76 us: latency-bound)
    return part.view(programs, 2, w // c, c).sum((0, 2))


def _col_sums_choice(x2: torch.Tensor, chunks: int) -> tuple[int, int, int, int, int]:
    """(programs per lane block, blocks a turn, wide rows a block, warps, stages) by x2's size
    (COL_SUMS_* above); programs 4,096 at most in all (a C with few factors of 2 has many lane
    blocks, C = 1001: 1,001, and each program's partial row is W floats), 4 in Triton's CPU
    interpreter (which runs the same loop shapes)."""
    nbytes = x2.numel() * x2.element_size()
    if nbytes < COL_SUMS_PIPELINED_BYTES:
        programs, *rest = COL_SUMS_SMALL
    else:
        big = nbytes >= COL_SUMS_BIG_BYTES
        programs = COL_SUMS_PROGRAMS // chunks if big else COL_SUMS_SMALL_PROGRAMS
        rest = COL_SUMS_PIPELINED
    most = max(1, min(programs, 4096 // chunks)) if x2.is_cuda else 4
    return (most, *rest)


def _finish_grid(c: int) -> tuple[tuple[int], int]:
    """(grid, channels a program) of the _finish kernels: up to 128 channels a program."""
    block_c = min(128, triton.next_power_of_2(c))
    return (triton.cdiv(c, block_c),), block_c


def _apply(x2, g2, coef, out, act: int) -> None:
    t, w, rows, chunks = _wide(x2)
    _affine[(triton.cdiv(rows, BLOCK_R) * chunks,)](
        x2, x2 if g2 is None else g2, coef, out, t, x2.shape[1], w, chunks,
        ACT=act, GRAD=g2 is not None, BLOCK_R=BLOCK_R, LANES=LANES, BIG=_big(x2, w),
    )  # fmt: skip


def _acc(x: torch.Tensor) -> torch.dtype:
    """The statistics' dtype: fp32, or x's when wider (a float64 model's)."""
    return torch.promote_types(x.dtype, torch.float32)


def _activate(z: torch.Tensor, act: int) -> torch.Tensor:
    return z.clamp(0, 6) if act == RELU6 else z.clamp_min(0) if act == RELU else z


def _passes(z: torch.Tensor, act: int) -> torch.Tensor:
    if act == RELU6:
        return (z > 0) & (z < 6)
    return z > 0 if act == RELU else torch.ones_like(z, dtype=torch.bool)


@torch.library.custom_op("paratrain::batch_norm_act", mutates_args=())
def batch_norm_act(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, act: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode BatchNorm of x over (N, H, W), then the activation `act`:
    -> (y channels_last in x's dtype, the batch mean, 1 / sqrt(biased variance + eps)), fp32."""
    if not _uses_triton(x):
        xf = x.to(_acc(x))
        var, mean = torch.var_mean(xf, dim=(0, 2, 3), unbiased=False)
        invstd = torch.rsqrt(var + eps)
        scale = weight.to(xf.dtype) * invstd
        z = xf * scale.view(1, -1, 1, 1) + (bias.to(xf.dtype) - mean * scale).view(1, -1, 1, 1)
        y = _activate(z, act).to(x.dtype).contiguous(memory_format=torch.channels_last)
        return y, mean, invstd
    x2 = _rows(x)
    c = x2.shape[1]
    weight, bias = weight.contiguous(), bias.contiguous()  # the kernels index them densely
    sums = _column_sums(x2, None, None, act)
    mean, invstd = (x.new_empty(c, dtype=torch.float32) for _ in range(2))
    coef = x.new_empty(2 * c, dtype=torch.float32)
    grid, block_c = _finish_grid(c)
    _finish_stats[grid](
        x2, sums, weight, bias, mean, invstd, coef, c, x2.shape[0], eps, BLOCK_C=block_c
    )
    y = _like(x)
    _apply(x2, None, coef, _rows(y), act)
    return y, mean, invstd


@batch_norm_act.register_fake
def _(x, weight, bias, eps, act):
    c = x.shape[1]
    stat = x.new_empty(c, dtype=_acc(x))
    return _like(x), stat, stat.clone()


@torch.library.custom_op("paratrain::batch_norm_act_backward", mutates_args=())
def batch_norm_act_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    act: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (input gradient channels_last in x's dtype, weight and bias gradients in the
    statistics' dtype)."""
    count = x.numel() // x.shape[1]
    if _uses_triton(x):
        x2, g2 = _rows(x), _rows(grad.to(x.dtype))
        c = x2.shape[1]
        weight, bias, mean, invstd = (t.contiguous() for t in (weight, bias, mean, invstd))
        sums = _column_sums(x2, g2, (weight, bias, mean, invstd), act)
        coef = x.new_empty(5 * c, dtype=torch.float32)
        dweight, dbias = torch.empty_like(mean), torch.empty_like(mean)
        grid, block_c = _finish_grid(c)
        _finish_grad[grid](
            sums, weight, bias, mean, invstd, coef, dweight, dbias, c, count, BLOCK_C=block_c
        )
        dx = _like(x)
        _apply(x2, g2, coef, _rows(dx), act)
        return dx, dweight, dbias
    scale = weight.to(invstd.dtype) * invstd
    shift = bias.to(invstd.dtype) - mean * scale
    xf = x.to(invstd.dtype)
    z = xf * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
    g = torch.where(_passes(z, act), grad.to(xf.dtype), 0.0)
    sum_g, sum_gx = g.sum((0, 2, 3)), (g * (xf - mean.view(1, -1, 1, 1))).sum((0, 2, 3))
    # dx = scale * (g - mean(g) - xhat * mean(g * xhat)), an affine function of g and x
    k2 = -scale * invstd * invstd * sum_gx / count
    k3 = -scale * sum_g / count - k2 * mean
    dx = scale.view(1, -1, 1, 1) * g + k2.view(1, -1, 1, 1) * xf + k3.view(1, -1, 1, 1)
    dx = dx.to(x.dtype).contiguous(memory_format=torch.channels_last)
    return dx, sum_gx * invstd, sum_g


@batch_norm_act_backward.register_fake
def _(grad, x, weight, bias, mean, invstd, act):
    return _like(x), mean.new_empty(mean.shape), mean.new_empty(mean.shape)


def _setup(ctx, inputs, output):
    x, weight, bias, _, act = inputs
    _, mean, invstd = output
    ctx.save_for_backward(x, weight, bias, mean, invstd)
    ctx.act = act
    ctx.mark_non_differentiable(mean, invstd)


def _backward(ctx, grad, _mean, _invstd):
    x, weight, bias, mean, invstd = ctx.saved_tensors
    dx, dw, db = batch_norm_act_backward(grad, x, weight, bias, mean, invstd, ctx.act)
    return dx, dw.to(weight.dtype), db.to(bias.dtype), None, None


batch_norm_act.register_autograd(_backward, setup_context=_setup)


class TritonBatchNorm(nn.Module):
    """A BatchNorm2d (its Parameters and buffers, under the same names) and the activation that
    followed it, in training through paratrain::batch_norm_act, in eval as PyTorch does."""

    def __init__(self, bn: nn.BatchNorm2d, act: int = NONE):
        super().__init__()
        self.weight, self.bias = bn.weight, bn.bias
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)
        self.eps, self.momentum, self.act = bn.eps, bn.momentum, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            y = F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
            return _activate(y, self.act)
        count = x.numel() // x.shape[1]
        if count < 2:  # nn.BatchNorm2d's refusal: no variance from one value
            raise ValueError(f"Expected more than 1 value per channel when training, got {count}")
        y, mean, invstd = batch_norm_act(x, self.weight, self.bias, self.eps, self.act)
        with torch.no_grad():  # as nn.BatchNorm2d: the unbiased variance into the running one
            var = (invstd.pow(-2) - self.eps).clamp_min(0) * (count / (count - 1))
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_(var.to(self.running_var.dtype), self.momentum)
            self.num_batches_tracked.add_(1)
        return y

    def extra_repr(self) -> str:
        act = {NONE: "", RELU: ", then ReLU", RELU6: ", then ReLU6"}[self.act]
        return f"{self.weight.shape[0]}, eps={self.eps}, momentum={self.momentum}{act}"


def _swappable(bn: nn.Module) -> bool:
    return (
        type(bn) is nn.BatchNorm2d
        and bn.affine
        and bn.track_running_stats
        and bn.momentum is not None
    )


def _activation(module: nn.Module) -> int | None:
    if type(module) is nn.ReLU6:
        return RELU6
    return RELU if type(module) is nn.ReLU else None


def triton_batchnorm(model: nn.Module) -> int:
    """Swap model's BatchNorm2d layers for TritonBatchNorm; a ReLU6 / ReLU right after one in
    the same nn.Sequential joins it (and becomes nn.Identity, so the state dict keeps its keys).
    -> how many BatchNorm layers were swapped."""
    joined: dict[int, int] = {}
    # only containers that run their layers one after another (a subclass with a forward of
    # its own might not: its ReLU cannot be moved)
    plain = [m for m in model.modules() if isinstance(m, nn.Sequential)]
    for seq in [m for m in plain if type(m).forward is nn.Sequential.forward]:
        items = list(seq.named_children())
        for (_, bn), (name, nxt) in zip(items, items[1:], strict=False):
            act = _activation(nxt)
            if _swappable(bn) and act is not None:
                joined[id(bn)] = act
                setattr(seq, name, nn.Identity())
    return swap_modules(model, _swappable, lambda bn: TritonBatchNorm(bn, joined.get(id(bn), NONE)))
