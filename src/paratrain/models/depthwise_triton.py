"""Depthwise convolutions as Triton kernels that read each tensor once (model.depthwise_conv=triton).

A depthwise k x k convolution has no reduction over channels: each output pixel is k*k products
of one input pixel and one weight per channel, so the layer is bound by memory, not arithmetic.
On MobileNetV2 at 500x500 input the two 250x250 depthwise layers are the largest tensors of the
step (64 x 96 x 250 x 250 in bf16: 768 MB). cuDNN runs them with a generic direct kernel; the
shift-add form (models/depthwise.py) lets inductor fuse each into one forward kernel, but its
backward is k*k strided slices summed (several passes, and each tap's gradient scattered back
into a padded input). These kernels make one pass each, on channels_last tensors (the channels
contiguous, so a block of pixels x channels is one coalesced load):

- forward: a block of output pixels x channels; the k*k taps read from cache after the first;
- input gradient: a block of input pixels gathers the output gradients of the taps that read it
  (no scatter, no atomics, no padded copy), the pixels grouped by their residue modulo the
  stride so that each program runs only the taps that reach its pixels;
- weight and bias gradients (3x3; cuDNN's for other sizes): each program sums products over its
  share of the output pixels into 10 rows per channel; torch sums the programs' rows (small).

Products and sums are fp32; the weight is rounded to the input's dtype first (what a bf16
convolution computes with), the bias added in fp32, as in models/depthwise.py. The op is a torch
custom op (paratrain::depthwise_conv2d) so torch.compile keeps it whole and CUDA graphs capture
it. Without CUDA (and without TRITON_INTERPRET=1, Triton's CPU interpreter the tests use) the
same op runs PyTorch's convolution and its gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paratrain.kernels import big, block_index, tl, triton, uses_triton
from paratrain.models.depthwise import Depthwise

if triton is not None:

    @triton.jit
    def _pixel(p, Ho, Wo):
        wo = p % Wo
        t = p // Wo
        return t // Ho, t % Ho, wo

    @triton.jit
    def _tap(
        x, n, ho, wo, c, pm, cm, H, W, sxn, sxc, sxh, sxw,
        TI: tl.constexpr, TJ: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        ONE: tl.constexpr,
    ):  # fmt: skip
        """The input pixels tap (TI, TJ) of each output pixel reads (0 in the padding), fp32:
        what the forward multiplies by the tap's weight, and the weight gradient by dy.
        ONE: the input has one channel, which every output channel reads (a stem on grayscale
        images): one load a pixel, [BLOCK_P, 1], broadcast over the channels where used."""
        hi = ho * SH - PH + TI * DH
        wi = wo * SW - PW + TJ * DW
        ok = pm & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        at = n * sxn + hi * sxh + wi * sxw
        if ONE:
            xv = tl.load(x + at, ok, 0.0)[:, None]
        else:
            xv = tl.load(x + at[:, None] + c[None, :] * sxc, ok[:, None] & cm[None, :], 0.0)
        return xv.to(tl.float32)

    @triton.jit
    def _dw_forward(
        x, w, b, y,
        P, C, H, W, Ho, Wo,
        sxn, sxc, sxh, sxw, syn, syc, syh, syw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BIG: tl.constexpr,
        ONE: tl.constexpr,
    ):  # fmt: skip
        p = block_index(tl.program_id(0) * BLOCK_P, BLOCK_P, BIG)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        pm, cm = p < P, c < C
        n, ho, wo = _pixel(p, Ho, Wo)
        acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
        t = (x, n, ho, wo, c, pm, cm, H, W, sxn, sxc, sxh, sxw)
        for i in tl.static_range(KH):
            for j in tl.static_range(KW):
                k = tl.load(w + (i * KW + j) * C + c, cm, 0.0).to(tl.float32)
                acc += _tap(*t, i, j, SH, SW, PH, PW, DH, DW, ONE) * k[None, :]
        if HAS_BIAS:
            acc += tl.load(b + c, cm, 0.0).to(tl.float32)[None, :]
        at = n * syn + ho * syh + wo * syw
        out = at[:, None] + c[None, :] * syc
        tl.store(y + out, acc.to(y.dtype.element_ty), pm[:, None] & cm[None, :])

    @triton.jit
    def _dw_input_grad(
        g, w, dx,
        N, C, H, W, Ho, Wo,
        sgn, sgc, sgh, sgw, sxn, sxc, sxh, sxw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BIG: tl.constexpr,
    ):  # fmt: skip
        """A block of input pixels of one residue class (h % SH, w % SW) = (rh, rw), the grid's
        third axis: which taps reach a pixel depends on its class only, so each program runs
        just those taps (at stride 2, 1 to 4 of the 9; every lane's load used), the others
        skipped whole. Stride 1 has the one class."""
        rh = tl.program_id(2) // SW
        rw = tl.program_id(2) % SW
        hc = (H - rh + SH - 1) // SH  # the class's rows and columns
        wc = (W - rw + SW - 1) // SW
        q = block_index(tl.program_id(0) * BLOCK_P, BLOCK_P, BIG)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        qm, cm = q < N * hc * wc, c < C
        n, a, b = _pixel(q, hc, wc)
        h = a * SH + rh
        wi = b * SW + rw
        acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
        for i in tl.static_range(KH):
            # tap i reads row h from output row (h + PH - i * DH) / SH when that divides: a
            # multiple of SH added keeps the residue's operand non-negative
            if (rh + PH + KH * DH * SH - i * DH) % SH == 0:
                hs = h + PH - i * DH
                ho = (hs + KH * DH * SH) // SH - KH * DH  # = hs / SH, exact, also below 0
                hok = (hs >= 0) & (ho < Ho)
                for j in tl.static_range(KW):
                    if (rw + PW + KW * DW * SW - j * DW) % SW == 0:
                        ws = wi + PW - j * DW
                        wo = (ws + KW * DW * SW) // SW - KW * DW
                        ok = qm & hok & (ws >= 0) & (wo < Wo)
                        at = n * sgn + ho * sgh + wo * sgw
                        v = tl.load(
                            g + at[:, None] + c[None, :] * sgc, ok[:, None] & cm[None, :], 0.0
                        )
                        k = tl.load(w + (i * KW + j) * C + c, cm, 0.0).to(tl.float32)
                        acc += v.to(tl.float32) * k[None, :]
        at = n * sxn + h * sxh + wi * sxw
        tl.store(
            dx + at[:, None] + c[None, :] * sxc,
            acc.to(dx.dtype.element_ty),
            qm[:, None] & cm[None, :],
        )

    @triton.jit
    def _dw_weight_grad_3x3(
        g, x, part,
        P, C, H, W, Ho, Wo, blocks,
        sgn, sgc, sgh, sgw, sxn, sxc, sxh, sxw,
        SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
        DH: tl.constexpr, DW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BIG: tl.constexpr,
        ONE: tl.constexpr, STAGES: tl.constexpr,
    ):  # fmt: skip
        """Each program's 10 rows of per-channel sums over its output pixels: the 9 taps'
        weight gradients, then the bias gradient. One accumulator a row, summed over the pixels
        once at the end (not a cross-thread sum per block: 3x3 spelled out for that)."""
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        z = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
        a00, a01, a02, a10, a11, a12, a20, a21, a22, ab = z, z, z, z, z, z, z, z, z, z
        for blk in tl.range(tl.program_id(0), blocks, tl.num_programs(0), num_stages=STAGES):
            p = block_index(blk * BLOCK_P, BLOCK_P, BIG)
            pm = p < P
            n, ho, wo = _pixel(p, Ho, Wo)
            at = n * sgn + ho * sgh + wo * sgw
            gv = tl.load(g + at[:, None] + c[None, :] * sgc, pm[:, None] & cm[None, :], 0.0)
            gv = gv.to(tl.float32)
            ab += gv
            t = (x, n, ho, wo, c, pm, cm, H, W, sxn, sxc, sxh, sxw)
            a00 += gv * _tap(*t, 0, 0, SH, SW, PH, PW, DH, DW, ONE)
            a01 += gv * _tap(*t, 0, 1, SH, SW, PH, PW, DH, DW, ONE)
            a02 += gv * _tap(*t, 0, 2, SH, SW, PH, PW, DH, DW, ONE)
            a10 += gv * _tap(*t, 1, 0, SH, SW, PH, PW, DH, DW, ONE)
            a11 += gv * _tap(*t, 1, 1, SH, SW, PH, PW, DH, DW, ONE)
            a12 += gv * _tap(*t, 1, 2, SH, SW, PH, PW, DH, DW, ONE)
            a20 += gv * _tap(*t, 2, 0, SH, SW, PH, PW, DH, DW, ONE)
            a21 += gv * _tap(*t, 2, 1, SH, SW, PH, PW, DH, DW, ONE)
            a22 += gv * _tap(*t, 2, 2, SH, SW, PH, PW, DH, DW, ONE)
        out = part + tl.program_id(0) * 10 * C + c
        tl.store(out, tl.sum(a00, 0), cm)
        tl.store(out + C, tl.sum(a01, 0), cm)
        tl.store(out + 2 * C, tl.sum(a02, 0), cm)
        tl.store(out + 3 * C, tl.sum(a10, 0), cm)
        tl.store(out + 4 * C, tl.sum(a11, 0), cm)
        tl.store(out + 5 * C, tl.sum(a12, 0), cm)
        tl.store(out + 6 * C, tl.sum(a20, 0), cm)
        tl.store(out + 7 * C, tl.sum(a21, 0), cm)
        tl.store(out + 8 * C, tl.sum(a22, 0), cm)
        tl.store(out + 9 * C, tl.sum(ab, 0), cm)


def _taps(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[C, 1, kh, kw] -> [kh * kw, C] in the input's dtype: the weight rounded as a
    convolution in that dtype computes with it, each tap's channels contiguous. A program then
    reads a tap's weights in one vector load per thread; as [C, 1, kh, kw] each channel's was
    a load of its own, 8 a tap against 1 for the pixels (sm_90 SASS, 2026-12-03)."""
    return weight.reshape(weight.shape[0], -1).t().to(dtype).contiguous()


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _channel_block(c: int) -> int:
    """Channels a program: all of a small layer's (one coalesced row a pixel), 64 at most; where
    blocks of 64 would leave more than a tenth of their lanes masked, the largest power of two
    (DIVIDING_BLOCK or more) dividing C: MobileNetV2's 96-channel 250 px layer as 3 x 32
    channels, not 64 + 64 with half of the second masked (a quarter of every load and multiply
    for nothing)."""
    block = min(64, triton.next_power_of_2(c))
    divides = min(64, c & -c)  # the largest power of two dividing c
    if triton.cdiv(c, block) * block > 1.1 * c and divides >= DIVIDING_BLOCK:
        block = divides
    return block


# Elements a program (the forward's and the input gradient's; the weight gradient's), and warps
# a program. The 9 taps' loads are all in flight at once: 4,096-element blocks on 4 warps
# spilled registers (ptxas, sm_90), 1,024 use ~130 and none; the weight gradient's 10
# accumulators of 512 elements ~100 (1,024-element ones: 212). benchmarks/device/dw_sweep.py
# times other choices kernel by kernel: on the H200 (benchmarks/results/2026-12-03-h200x1/issue34/) these were the fastest of
# 7 over MobileNetV2's layers (9.14 ms of kernels; 2,048-element tiles or 8 warps 10.8-11.6,
# 512-element tiles 10.3).
TILE, WGRAD_TILE, WARPS = 1024, 512, 4
WGRAD_STAGES = 1  # the weight gradient's loop unpipelined: 3 stages took 9.31 ms (call 29)
# the smallest channel block that divides C (_channel_block): 32 (64-byte pieces of a pixel's
# channels); 16 (144 channels as 9 x 16) was faster only at 144 channels, 125 px, stride 1 (1.54
# against 1.71 ms, call 29), a layer cuDNN runs faster still (1.30)
DIVIDING_BLOCK = 32


def _blocks(c: int) -> tuple[int, int]:
    """(pixels, channels) per program: TILE elements a block."""
    block_c = _channel_block(c)
    return max(1, TILE // block_c), block_c


def _shape(x, weight, stride, padding, dilation):
    """The output's channels are the weight's: x's own, or, from one input channel, each output
    channel's convolution of that one (_one)."""
    n, _, h, w = x.shape
    c, _, kh, kw = weight.shape
    ho = _out_size(h, kh, stride[0], padding[0], dilation[0])
    wo = _out_size(w, kw, stride[1], padding[1], dilation[1])
    return n, c, h, w, kh, kw, ho, wo


def _one(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One input channel read by every output channel: a grayscale stem (MobileNetV2's first
    convolution on MNIST, 1 -> 32), the depthwise convolution of the input broadcast over the
    weight's channels (groups=1 in PyTorch's terms)."""
    return x.shape[1] == 1 and weight.shape[0] > 1


def _geometry(weight, stride, padding, dilation) -> dict:
    kh, kw = weight.shape[2:]
    return dict(
        KH=kh, KW=kw, SH=stride[0], SW=stride[1], PH=padding[0], PW=padding[1],
        DH=dilation[0], DW=dilation[1],
    )  # fmt: skip


def _acc(weight: torch.Tensor) -> torch.dtype:
    """The weight and bias gradients' dtype: fp32, or the weight's when wider."""
    return torch.promote_types(weight.dtype, torch.float32)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


@torch.library.custom_op("paratrain::depthwise_conv2d", mutates_args=())
def depthwise_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> torch.Tensor:
    """A depthwise convolution (groups = channels) of a channels_last input, or of a one-channel
    input broadcast over the weight's channels (_one); the output channels_last in the input's
    dtype."""
    n, c, h, w, kh, kw, ho, wo = _shape(x, weight, stride, padding, dilation)
    groups = x.shape[1]  # c, or 1 from one channel
    if not uses_triton(x):  # channels_last, as the fake says (inductor checks the strides)
        k = weight.to(x.dtype)
        b = None if bias is None else bias.to(x.dtype)
        return _channels_last(F.conv2d(x, k, b, stride, padding, dilation, groups))
    x = _channels_last(x)  # a one-channel input's NCHW layout already is
    y = torch.empty(
        (n, c, ho, wo), dtype=x.dtype, device=x.device, memory_format=torch.channels_last
    )
    block_p, block_c = _blocks(c)
    grid = (triton.cdiv(n * ho * wo, block_p), triton.cdiv(c, block_c))
    _dw_forward[grid](
        x, _taps(weight, x.dtype), bias if bias is not None else weight, y,
        n * ho * wo, c, h, w, ho, wo, *x.stride(), *y.stride(),
        **_geometry(weight, stride, padding, dilation),
        HAS_BIAS=bias is not None, BLOCK_P=block_p, BLOCK_C=block_c, BIG=big(x, y),
        ONE=_one(x, weight), num_warps=WARPS,
    )  # fmt: skip
    return y


@depthwise_conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation):
    n, c, _, _, _, _, ho, wo = _shape(x, weight, stride, padding, dilation)
    return torch.empty(
        (n, c, ho, wo), dtype=x.dtype, device=x.device, memory_format=torch.channels_last
    )


@torch.library.custom_op("paratrain::depthwise_conv2d_backward", mutates_args=())
def depthwise_conv2d_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    input_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (input gradient in the input's dtype, weight and bias gradients in fp32, or in the
    weight's dtype when wider). input_grad=False (an input that needs none: a stem's images):
    the input gradient is an empty tensor, not computed."""
    n, c, h, w, kh, kw, ho, wo = _shape(x, weight, stride, padding, dilation)
    groups, one = x.shape[1], _one(x, weight)
    if not uses_triton(x):
        k, g = weight.to(x.dtype), grad.to(x.dtype)
        dx = x.new_empty(0)
        if input_grad:
            dx = torch.nn.grad.conv2d_input(x.shape, k, g, stride, padding, dilation, groups)
            dx = _channels_last(dx)
        dw = torch.nn.grad.conv2d_weight(x, weight.shape, g, stride, padding, dilation, groups)
        return dx, dw.to(_acc(weight)).contiguous(), g.to(_acc(weight)).sum((0, 2, 3))
    x, grad = _channels_last(x), _channels_last(grad.to(x.dtype))
    block_p, block_c = _blocks(c)
    geometry = _geometry(weight, stride, padding, dilation)
    sh, sw = stride
    dx = x.new_empty(0)
    if input_grad and one:  # the sum over the output channels: cuDNN's (not a stem's need)
        k = weight.to(x.dtype)
        dx = torch.nn.grad.conv2d_input(x.shape, k, grad, stride, padding, dilation, 1)
        dx = _channels_last(dx)
    elif input_grad:
        dx = torch.empty_like(x, memory_format=torch.channels_last)
        # the largest residue class (0, 0) sets the pixel blocks; the others mask their tail
        pixel_blocks = triton.cdiv(n * triton.cdiv(h, sh) * triton.cdiv(w, sw), block_p)
        grid = (pixel_blocks, triton.cdiv(c, block_c), sh * sw)
        _dw_input_grad[grid](
            grad, _taps(weight, x.dtype), dx, n, c, h, w, ho, wo, *grad.stride(), *x.stride(),
            **geometry, BLOCK_P=block_p, BLOCK_C=block_c, BIG=big(x, grad), num_warps=WARPS,
        )  # fmt: skip
    if (kh, kw) != (3, 3):  # the weight gradient's kernel is written for 3x3: cuDNN's here
        dw = torch.nn.grad.conv2d_weight(x, weight.shape, grad, stride, padding, dilation, groups)
        return dx, dw.to(_acc(weight)), grad.to(_acc(weight)).sum((0, 2, 3))
    block_c = _channel_block(c)
    block_p = max(1, WGRAD_TILE // block_c)
    blocks = triton.cdiv(n * ho * wo, block_p)
    # a few waves of the GPU's SMs in all, over the channel blocks: 2,048 programs for each
    # of 960 channels' 15 blocks would write 78 MB of partial sums for a 31 MB layer (16 px)
    chunks = triton.cdiv(c, block_c)
    programs = min(blocks, max(1, (2048 if x.is_cuda else 4) // chunks))
    part = torch.empty((programs, 10, c), dtype=torch.float32, device=x.device)
    geometry = {k: v for k, v in geometry.items() if k not in ("KH", "KW")}
    _dw_weight_grad_3x3[(programs, chunks)](
        grad, x, part, n * ho * wo, c, h, w, ho, wo, blocks, *grad.stride(), *x.stride(),
        **geometry, BLOCK_P=block_p, BLOCK_C=block_c, BIG=big(x, grad), ONE=one,
        STAGES=WGRAD_STAGES, num_warps=WARPS,
    )  # fmt: skip
    total = part.sum(0).to(_acc(weight))
    # copies: with one channel these would be views of `total`, which a custom op may not return
    dw = total[:9].t().reshape(c, 1, 3, 3).clone(memory_format=torch.contiguous_format)
    return dx, dw, total[9].clone()


@depthwise_conv2d_backward.register_fake
def _(grad, x, weight, stride, padding, dilation, input_grad=True):
    c = weight.shape[0]
    dx = x.new_empty(0)
    if input_grad:
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return (
        dx,
        weight.new_empty(weight.shape, dtype=_acc(weight)),
        x.new_empty(c, dtype=_acc(weight)),
    )


def _setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry = (stride, padding, dilation)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    input_grad = ctx.needs_input_grad[0]
    dx, dw, db = depthwise_conv2d_backward(grad, x, weight, *ctx.geometry, input_grad)
    db = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
    return dx if input_grad else None, dw.to(weight.dtype), db, None, None, None


depthwise_conv2d.register_autograd(_backward, setup_context=_setup)


class TritonDepthwise(Depthwise):
    """paratrain::depthwise_conv2d (models/depthwise.py's Depthwise: the same Parameters under
    the same names, so state dicts, checkpoints and optimizers do not see the swap)."""

    def swapped(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):  # a convolution computes in autocast's dtype
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return depthwise_conv2d(
            x, self.weight, self.bias, list(self.stride), list(self.padding), list(self.dilation)
        )
