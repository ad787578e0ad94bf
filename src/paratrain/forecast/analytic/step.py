"""The analytic step: one training step of a Llama-style decoder on N GPUs from its
shape, the layout and a hardware profile, with no GPU. Pure functions; each term is written out
below and tested on hand-computed cases (tests/unit/test_plan_analytic.py).

Compute, per GPU, per micro-batch of T tokens, per decoder layer (tensor parallel over t splits
each term t ways):
- matmuls: 2 T P_layer forward, twice that backward (input and weight gradients; PaLM App. B),
  plus the recomputed forward: none; selective (op policy: every second matmul of a layer
  recomputed, attention's output kept: k, o and up of q, k, v, o, gate, up, down); full (the
  whole forward again). float8 runs the layers' matmuls at the float8 rate; lm_head stays bf16.
- attention (flash, causal): 2 T s h forward (QK^T and PV, half of the square), 2.5x that
  backward (FlashAttention's five matmuls to its two), again forward under full AC only.
- memory-bound work as HBM bytes per token: the norms, rotary, residual adds, GQA's repeated
  k / v and SwiGLU, eager (each op reads and writes its tensors, the norms in fp32) or compiled
  (one fused kernel per group); backward twice the forward's traffic, recompute once more; and
  float8's casts (amax + cast of each matmul's input and output gradient, and their transposes).
- the head: lm_head's matmuls and the loss over T x vocab fp32 logits; the optimizer (AdamW,
  foreach, over each GPU's shard) and gradient clipping.

Communication (Hardware.collective_s: the profile's latency plus the size over its bus bandwidth,
nccl-tests' figures; a group that spans nodes runs at its GPUs' NICs' rate, at most NVLink's):
- FSDP (ZeRO-3 over dp_shard): each layer all-gathered in forward and again in backward (bf16,
  or float8 weights with float8 all-gather), reduce-scattered in fp32; prefetched under the
  neighbouring layer's compute, exposed where it outlasts it, plus the first all-gather and the
  last reduce-scatter and the root module's (embedding, lm_head), which nothing hides. Under a
  pipeline the layers stay gathered for the step (no reshard after forward): one all-gather and
  one reduce-scatter a step.
- TP with sequence parallelism: 4 collectives of T x hidden per layer in forward (all-gather
  before attention and the MLP, reduce-scatter after), 4 in backward, 4 more when full AC
  recomputes the forward; the forward's all-gathers in float8 under float8. None hidden; async
  TP hides the forward's (and recompute's) all-gathers behind the matmuls they feed; the
  reduce-scatters and the backward's collectives stay exposed (an assumption: hiding all of the
  forward's collectives predicts +16% for async TP on the 70B row, torchtitan measured +5.7%).
- PP: p stages, m micro-batches, v stages a rank: the step is the slowest rank's micro-batch
  time x (m + (p-1)/v) (model.bubble), plus the activations sent between stages.

Memory per GPU: fp32 weights, fp32 gradients and AdamW's two moments, sharded over dp_shard x t;
the layers gathered (two at a time under FSDP, all of a stage's under a pipeline, with their
unsharded gradients); saved activations by AC mode x micro-batches in flight; the loss's logits
and one layer's working set during backward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paratrain.errors import UserError
from paratrain.forecast.analytic.hardware import Hardware
from paratrain.forecast.calibrated.model import bubble
from paratrain.forecast.shapes import Shape
from paratrain.protocols import linear_matmuls

AC_MODES = ("none", "selective", "full")  # what the search weighs and --ac names
# torchtitan's "selective layer" (selective_ac_option = 2, and fms-fsdp's every-second-block):
# every second layer checkpointed whole, the others keep everything; published rows use it
LAYER_AC = "layer"
SCHEDULES = ("gpipe", "1f1b", "interleaved")
# sdpa's kernels the rates tables hold; "_gqa": k/v heads shared through enable_gqa (paratrain's
# decoder), the others with k/v expanded to the query heads first (torchtitan's repeat_kv)
ATTENTION = ("flash", "cudnn", "flash_gqa", "cudnn_gqa")

# HBM bytes per token of a layer's forward memory-bound ops, as multiples of the widths they
# touch (bf16 activations). Eager: RMSNorm in fp32 (cast, square, mean, scale, cast back, weight:
# ~36 bytes an element) twice, two residual adds (6), rotary on q and k through complex fp32
# (~20 an element), GQA's k and v expanded to the query heads (read kv, write h, each), SwiGLU
# (silu then multiply: 10 an element of the MLP's width). Compiled: each group one kernel: a
# norm with its residual add ~8 an element, rotary 4, SwiGLU 6.
EAGER = {"hidden": 2 * 36 + 2 * 6 + 20 + 2 * 2, "kv": 20 + 2 * 2, "ffn": 10}
COMPILED = {"hidden": 2 * 8 + 4, "kv": 4 + 2 * 2, "ffn": 6}
ADAMW_BYTES = 64  # foreach AdamW, fp32: ~8 passes of read + write over param, grad, 2 moments
FUSED_ADAMW_BYTES = 28  # one kernel: read param, grad, 2 moments (16), write 3 (12)
CLIP_BYTES = 12  # gradient clipping: the norm reads the gradient, the scaling reads and writes
# The loss over the logits, by how it runs: HBM bytes moved per logit, and bytes live per logit
# at its peak. eager: fp32 logits (upcast, log-softmax in two passes, its gradient, the cast
# back), live the fp32 log-softmax, its gradient and the bf16 gradient; compiled (torch.compile
# of the loss, torchtitan 0.2.2's default: its job_config compile.components = ["model",
# "loss"]): the upcast fused into the reductions, bf16 logits read in forward and again in
# backward with the bf16 gradient written, live the bf16 logits and their gradient; fused
# (paratrain's Triton loss): the gradient written in the forward's one pass, in place of the
# bf16 logits (live: that one tensor).
LOSS = {"eager": (40, 12), "compiled": (8, 4), "fused": (4, 2)}


@dataclass(frozen=True)
class Cut:
    """How N GPUs are cut: tensor parallel t inside, pipeline p, data parallel the rest (FSDP
    over dp_shard, HSDP replicas over dp_replicate)."""

    gpus: int
    tp: int = 1
    pp: int = 1
    dp_replicate: int = 1
    async_tp: bool = False
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    microbatches: int | None = None  # default: pp (torchtitan's)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    @property
    def micro(self) -> int:
        return self.microbatches or (self.pp if self.pp > 1 else 1)

    @property
    def v(self) -> int:
        return self.stages_per_rank if self.schedule == "interleaved" else 1

    def as_flag(self) -> str:
        """The `--layout` text that names this cut again (parse_cut's inverse)."""
        default = Cut(self.gpus)
        words = [
            k if k == "async_tp" else f"{k}={getattr(self, k)}"
            for k in LAYOUT_KEYS
            if getattr(self, k) != getattr(default, k) and getattr(self, k) is not False
        ]
        return ",".join(words) or "fsdp"

    def describe(self) -> str:
        parts = []
        if self.dp_replicate > 1 and self.dp_shard == 1:
            parts.append(f"DDP {self.dp_replicate}")
        elif self.dp_replicate > 1:
            parts.append(f"HSDP {self.dp_replicate}x{self.dp_shard}")
        elif self.dp_shard > 1:
            parts.append(f"FSDP {self.dp_shard}")
        if self.tp > 1:
            parts.append(f"TP {self.tp}" + (" async" if self.async_tp else ""))
        if self.pp > 1:
            sched = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": f"interleaved 1F1B x{self.v}"}
            parts.append(f"PP {self.pp} {sched[self.schedule]}, {self.micro} micro-batches")
        return " x ".join(parts) or "1 GPU"


@dataclass(frozen=True)
class Training:
    seq_len: int = 8192
    local_batch: int = 1  # sequences per data-parallel rank a step
    ac: str = "selective"
    compile: bool = False
    float8: bool = False
    fp8_all_gather: bool | None = None  # None: on with float8 (torchtitan's 405B setting)
    lora: bool = False  # frozen bf16 weights, small adapters: no weight gradients, no optimizer
    loss: str = "eager"  # eager (torchtitan 2024), compiled (torchtitan 0.2.2), fused: LOSS
    attention: str | None = None  # sdpa's kernel: flash, cudnn (None: the profile's)
    fused_optimizer: bool = False  # one AdamW kernel (torchtitan 2024: foreach)

    @property
    def fp8_gather(self) -> bool:
        return self.float8 if self.fp8_all_gather is None else self.fp8_all_gather

    def as_flags(self) -> list[str]:
        """`paratrain plan --layout`'s flags that name this training again (beside --ac and
        --local-batch): the sequence, float8, eager, a loss other than the compile choice's, the
        attention kernel where one is named. LoRA, fused AdamW and a bf16 all-gather under
        float8 have no flag (the suite prices such rows through the function)."""
        words = [f"--seq-len {self.seq_len}"]
        words += ["--float8"] if self.float8 else []
        words += [] if self.compile else ["--eager"]
        words += [] if self.loss == implied_loss(self.compile) else [f"--loss {self.loss}"]
        return words + ([f"--attention {self.attention}"] if self.attention else [])


def implied_loss(compile: bool) -> str:
    """The loss `plan` assumes with and without torch.compile: compiled with it (torchtitan's
    since 2025-04), eager without."""
    return "compiled" if compile else "eager"


LAYOUT_KEYS = (
    "tp",
    "pp",
    "dp_replicate",
    "async_tp",
    "schedule",
    "stages_per_rank",
    "microbatches",
)


def parse_cut(text: str, gpus: int) -> Cut:
    """`--layout tp=8,pp=4,schedule=interleaved,stages_per_rank=2,microbatches=16,async_tp` at
    N GPUs -> the Cut (FSDP takes the GPUs the others leave). One line for a word it does not
    know, a value that is not a number, or a key given twice."""
    import difflib

    fields: dict[str, object] = {}
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        key, _, value = word.partition("=")
        key = key.strip()
        if key == "fsdp":  # FSDP over every GPU the others leave: the cut's default
            if value:
                raise UserError("--layout: fsdp takes no value (FSDP takes the GPUs left)")
            continue
        if key not in LAYOUT_KEYS:
            words = ("fsdp", *LAYOUT_KEYS)
            near = difflib.get_close_matches(key, words, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise UserError(
                f"--layout: unknown {key!r}{hint}; use {', '.join(words)} (comma-separated)"
            )
        if key in fields:
            raise UserError(f"--layout: {key} given twice")
        if key == "async_tp":
            if value not in ("", "true", "false"):
                raise UserError(f"--layout: async_tp takes no value or true/false, got {value!r}")
            fields[key] = value != "false"
        elif key == "schedule":
            if value not in SCHEDULES:
                raise UserError(f"--layout: schedule={value!r}; choose {', '.join(SCHEDULES)}")
            fields[key] = value
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                raise UserError(f"--layout: {key} needs a whole number, got {value!r}") from None
            if fields[key] < 1:
                raise UserError(f"--layout: {key} must be >= 1, got {value}")
    return Cut(gpus, **fields)


def check(shape: Shape, layout: Cut, train: Training) -> None:
    """One line for a layout the model cannot be cut into."""
    if train.ac not in (*AC_MODES, LAYER_AC):
        modes = ", ".join((*AC_MODES, LAYER_AC))
        raise UserError(f"activation checkpointing: {train.ac!r}; choose {modes}")
    if train.attention not in (None, *ATTENTION):
        raise UserError(f"attention: {train.attention!r}; choose {', '.join(ATTENTION)}")
    if train.loss not in LOSS:
        raise UserError(f"loss: {train.loss!r}; choose {', '.join(LOSS)}")
    if layout.schedule not in SCHEDULES:
        raise UserError(f"schedule: {layout.schedule!r}; choose {', '.join(SCHEDULES)}")
    if layout.gpus % (layout.tp * layout.pp) or layout.dp % layout.dp_replicate:
        raise UserError(
            f"layout: {layout.gpus} GPUs do not split into TP {layout.tp} x PP {layout.pp} x "
            f"{layout.dp_replicate} replicas"
        )
    if shape.heads % layout.tp or shape.kv_heads % layout.tp and layout.tp % shape.kv_heads:
        raise UserError(f"layout: TP {layout.tp} does not divide {shape.name}'s heads")
    if layout.pp * layout.v > shape.layers:
        raise UserError(f"layout: {layout.pp * layout.v} stages for {shape.layers} layers")
    if train.local_batch % layout.micro:
        raise UserError(
            f"layout: local batch {train.local_batch} does not split into {layout.micro} "
            "micro-batches"
        )


def full_share(ac: str) -> float:
    """The share of layers whose whole forward runs again: full 1, every second layer 1/2."""
    return {"full": 1.0, LAYER_AC: 0.5}.get(ac, 0.0)


def recompute_share(shape: Shape, ac: str) -> float:
    """The share of a layer's forward matmul FLOPs that activation checkpointing runs again:
    none 0, full 1, layer 1/2 (every second layer whole), selective (op policy) the matmuls at
    even places in forward order."""
    if ac == "none":
        return 0.0
    if ac in ("full", LAYER_AC):
        return full_share(ac)
    linears = list(shape.linears().values())
    again = sum(i * o for n, (i, o) in enumerate(linears, 1) if n % 2 == 0)
    return again / shape.layer_matmul_params


COLUMN_PARALLEL = ("q", "k", "v", "gate", "up")  # split by output features under TP


def gemms(shape: Shape, tokens: int, tp: int) -> dict[str, list[tuple[int, int, int]]]:
    """A decoder layer's GEMMs on one rank for a micro-batch of `tokens` tokens, as torch runs
    them, (M, N, K) each: the forward X W^T (tokens, out, in), the input's gradient dY W
    (tokens, in, out) and the weight's dY^T X (out, in, tokens). Under tensor parallelism
    (Megatron's plan) q, k, v, gate and up are split by their outputs, o and down by their
    inputs; sequence parallelism gathers the tokens first, so M stays the micro-batch's."""
    out: dict[str, list[tuple[int, int, int]]] = {
        "forward": [],
        "grad_input": [],
        "grad_weight": [],
    }
    for name, (i, o) in shape.linears().items():
        i, o = (i, o // tp) if name in COLUMN_PARALLEL else (i // tp, o)
        forward, grad_input, grad_weight = linear_matmuls(tokens, i, o)
        for kind, g in zip(out, (forward, grad_input, grad_weight), strict=True):
            out[kind].append((g.m, g.n, g.k))
    return out


def matmul_seconds(shape: Shape, hw: Hardware, tokens: int, tp: int, float8: bool) -> dict:
    """Seconds of a layer's GEMMs by pass on one rank, each at its own shape's rate."""
    return {
        kind: sum(hw.gemm_s(m, n, k, float8) for m, n, k in shapes)
        for kind, shapes in gemms(shape, tokens, tp).items()
    }


LORA_TARGETS, LORA_RANK = ("q", "v", "o"), 8  # paratrain's LoRA recipes (lora.target_modules, r)


def adapter_seconds(shape: Shape, hw: Hardware, tokens: int, tp: int) -> float:
    """A layer's LoRA adapters (rank LORA_RANK on LORA_TARGETS), forward and backward: per
    adapted linear six GEMMs with one side of width r (x A, (x A) B; dY B^T, (dY B^T) A^T; both
    weights' gradients), each reading or writing a [tokens, width] tensor: memory-bound, so
    each at the larger of its FLOPs at the profile's derated matmul rate (the rates table
    holds no r-wide shapes) and its bytes at the HBM rate."""
    total = 0.0
    for name in LORA_TARGETS:
        i, o = shape.linears()[name]
        i, o = (i, o // tp) if name in COLUMN_PARALLEL else (i // tp, o)
        # A (in -> r) and B (r -> out), each a linear layer whose weight trains
        for g in linear_matmuls(tokens, i, LORA_RANK) + linear_matmuls(tokens, LORA_RANK, o):
            moved = 2 * (g.m * g.k + g.k * g.n + g.m * g.n)  # bf16 operands and result
            total += max(2 * g.m * g.n * g.k / hw.matmul_flops(), moved / hw.memory_bytes_s())
    return total


def layer_terms(shape: Shape, hw: Hardware, train: Training, tokens: int, tp: int) -> dict:
    """Seconds of one decoder layer's forward + backward (+ recompute) on one GPU for a
    micro-batch of `tokens` tokens, by term; and the forward's share of it."""
    h, kv, f, s = shape.hidden, shape.kv_width, shape.ffn, train.seq_len
    r = recompute_share(shape, train.ac)
    mm_s = matmul_seconds(shape, hw, tokens, tp, train.float8)
    # frozen weights (LoRA): the input's gradient only
    mm = mm_s["forward"] + mm_s["grad_input"] + (0.0 if train.lora else mm_s["grad_weight"])
    mm += adapter_seconds(shape, hw, tokens, tp) if train.lora else 0.0
    recompute_mm = mm_s["forward"] * r  # the share of the forward's FLOPs run again
    att_fwd, att_bwd = hw.attention_s(shape.head_dim, shape.heads / tp, s, tokens, train.attention)
    att_again = att_fwd * full_share(train.ac)
    widths = COMPILED if train.compile else EAGER
    per_token = widths["hidden"] * h + widths["kv"] * kv + widths["ffn"] * f
    el_passes = 1 + 2 + (0 if train.ac == "none" else 1 if train.ac == "selective" else r)
    elementwise = tokens * per_token * el_passes / tp
    casts = 0.0
    if train.float8:
        # per matmul: its input's amax + cast forward (5 bytes an element; again on recompute),
        # its transposed cast for the weight gradient (3), the output gradient's amax, cast and
        # transpose (7); compiled, the amaxes fuse into the producers (2 bytes less each)
        again = 0 if train.ac == "none" else 1 if train.ac == "selective" else r
        fwd_in, bwd_in, bwd_out = (5, 3, 7) if not train.compile else (3, 3, 5)
        acts = sum(
            i * (fwd_in * (1 + again) + bwd_in) + o * bwd_out for i, o in shape.linears().values()
        )
        weights = shape.layer_matmul_params * (3 if train.fp8_gather else 8)
        casts = (tokens * acts + weights) / tp
    memory = (elementwise + casts) / hw.memory_bytes_s()
    total = mm + recompute_mm + att_fwd + att_bwd + att_again + memory
    return {
        "matmul_s": mm,
        "recompute_s": recompute_mm + att_again,
        "attention_s": att_fwd + att_bwd,
        "memory_bound_s": elementwise / hw.memory_bytes_s(),
        "float8_casts_s": casts / hw.memory_bytes_s(),
        "total_s": total,
        "forward_s": mm_s["forward"] + att_fwd,
    }


def head_s(shape: Shape, hw: Hardware, tokens: int, tp: int, train: Training) -> float:
    """lm_head's forward and backward matmuls (bf16: torchtitan keeps it out of float8) and
    the loss over fp32 logits (split over the vocabulary under TP's loss parallel)."""
    v, h = shape.vocab // tp, shape.hidden  # split by the vocabulary under TP
    mm = hw.gemm_s(tokens, v, h) + hw.gemm_s(tokens, h, v)  # forward, the input's gradient
    mm += 0.0 if train.lora else hw.gemm_s(v, h, tokens)  # the weight's gradient
    per_logit = LOSS[train.loss][0]
    loss = tokens * shape.vocab / tp * per_logit / hw.memory_bytes_s()
    return mm + loss


def split_layers(layers: int, stages: int) -> list[int]:
    """Contiguous stages as even as they go: the first `layers % stages` one layer more."""
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def rank_layers(shape: Shape, layout: Cut) -> list[int]:
    """Decoder layers on each pipeline rank (stages i, i + p, ... under interleaving)."""
    p, v = layout.pp, layout.v
    stages = split_layers(shape.layers, p * v)
    return [sum(stages[r + k * p] for k in range(v)) for r in range(p)]


def per_node(hw: Hardware, group: int, stride: int) -> int:
    """GPUs of a group of `group` GPUs `stride` apart on one node (the group's size where it
    fits in one node): a group spans nodes where this is less than its size."""
    return min(group, max(hw.gpus_per_node // stride, 1))


def fsdp_terms(
    shape: Shape, hw: Hardware, layout: Cut, train: Training, layers: int, layer: dict
) -> dict:
    """FSDP's communication a step, and what of it no compute hides (seconds). HSDP: the
    shards' gradients also all-reduced over the replicas (across nodes), layer by layer in
    backward beside the reduce-scatters."""
    d, tp, reps = layout.dp_shard, layout.tp, layout.dp_replicate
    if d <= 1 and reps <= 1:
        return {"fsdp_comm_s": 0.0, "fsdp_exposed_s": 0.0, "fsdp_copies_s": 0.0}
    shard = dict(per_node=per_node(hw, d, tp))
    weight_bytes = 1 if train.fp8_gather else 2
    gather = (shape.layer_matmul_params * weight_bytes + 2 * shape.hidden * 2) / tp
    ag = hw.collective_s(gather, d, **shard)
    rs = hw.collective_s(shape.layer_params / tp * 4, d, "reduce_scatter", **shard)
    root = (shape.embedding_params + shape.head_params) / tp
    root_ag = hw.collective_s(root * 2, d, **shard)
    root_rs = hw.collective_s(root * 4, d, "reduce_scatter", **shard)
    if reps > 1:  # the replicas' all-reduce of each shard, fp32 (DDP's where d = 1)
        across = dict(per_node=per_node(hw, reps, d * tp))
        rs += hw.collective_s(shape.layer_params / tp / d * 4, reps, "all_reduce", **across)
        root_rs += hw.collective_s(root / d * 4, reps, "all_reduce", **across)
    m = layout.micro
    fwd_c, bwd_c = layer["forward_s"] * m, (layer["total_s"] - layer["forward_s"]) * m
    # FSDP2's copies around its collectives, HBM bytes per parameter of the GPU's layers: the
    # all-gather's output copied out of the flat buffer (read + write), the gradients cast to
    # fp32 and copied into the reduce-scatter's buffer (read 2, write 4), and under a pipeline
    # each micro-batch's bf16 gradient added into the fp32 unsharded one (read 2 + 4, write 4)
    params = (layers * shape.layer_params + shape.embedding_params + shape.head_params) / tp
    if layout.pp > 1:  # gathered once a step, kept: one all-gather, one reduce-scatter a layer
        copies = params * (2 * weight_bytes + 6 + 10 * m)
        comm = layers * (ag + rs) + root_ag + root_rs
        hidden_under = layers * (fwd_c + bwd_c)
        exposed = ag + rs + max(comm - ag - rs - hidden_under, 0.0)
    else:
        # DDP (d = 1): the fp32 gradients copied into and out of its buckets instead
        copies = params * (2 * 2 * weight_bytes + 6) if d > 1 else params * 16
        comm = layers * (2 * ag + rs) + root_ag + root_rs
        per_layer = max(ag - fwd_c, 0.0) + max(ag + rs - bwd_c, 0.0)
        exposed = root_ag + root_rs + ag + rs + (layers - 1) * per_layer
    return {
        "fsdp_comm_s": comm,
        "fsdp_exposed_s": exposed,
        "fsdp_copies_s": copies / hw.memory_bytes_s(),
    }


def tp_terms(shape: Shape, hw: Hardware, layout: Cut, train: Training, tokens: int, layer: dict):
    """Tensor parallel's collectives for one layer and micro-batch, and what is exposed."""
    t = layout.tp
    if t <= 1:
        return 0.0, 0.0
    group = dict(per_node=per_node(hw, t, 1))
    whole = tokens * shape.hidden * 2
    gather_fwd = hw.collective_s(whole / (2 if train.float8 else 1), t, **group)
    scatter = hw.collective_s(whole, t, "reduce_scatter", **group)
    forward = 2 * gather_fwd + 2 * scatter
    backward = 2 * hw.collective_s(whole, t, **group) + 2 * scatter
    again = forward * full_share(train.ac)
    comm = forward + backward + again
    if not layout.async_tp:
        return comm, comm
    # async TP (2024's micro-pipelined TP, float8): each forward all-gather runs in pieces under
    # the matmul it feeds; the reduce-scatters and the backward's collectives stay exposed
    fwd_mm = layer["matmul_s"] / 3
    passes = 1 + full_share(train.ac)  # the forward, and the recompute's share of it again
    gathers = 2 * gather_fwd * passes
    exposed = comm - gathers + max(gathers - fwd_mm * passes, 0.0)
    return comm, exposed


def saved_per_token(shape: Shape, train: Training) -> float:
    """Bytes a layer saves for backward per token, by AC mode (bf16 activations)."""
    h, kv, f = shape.hidden, shape.kv_width, shape.ffn
    if train.ac == "full":
        return 2 * h
    if train.ac == LAYER_AC:  # half the layers keep their input, half keep everything
        return (2 * h + saved_per_token(shape, replace(train, ac="none"))) / 2
    if train.ac == "selective":  # the layer's input, q, v, attention's output, gate, down
        return 2 * (4 * h + kv + f)
    # LoRA (the base weights frozen; adapters on q, v, o as paratrain's recipes put them): a
    # frozen linear keeps no input for a weight gradient, so the MLP's down projection saves
    # nothing; eagerly peft's adapters keep two copies of the width more (measured on the CPU,
    # autograd's own saves: benchmarks/cpu/saved_activations.py, 2026-12-07-cpu/saved_activations)
    lora_less = 2 * f if train.lora else 0
    if train.compile:  # inductor's partition keeps the matmuls' inputs and attention's
        return 2 * (5 * h + 2 * kv + 3 * f) - lora_less
    # every op's, and eager RMSNorm's fp32 inputs (measured: 20 h + 4 kv + 8 f bytes on the CPU)
    return 2 * (6 * h + 2 * kv + 4 * f) + 8 * h - lora_less + (4 * h if train.lora else 0)


def in_flight(layout: Cut, r: int) -> float:
    """Micro-batches of a stage's layers pipeline rank r holds at its peak, as torch's
    schedules run them (measured: benchmarks/results/2026-12-06-cpu/pp_memory): GPipe all m;
    1F1B min(m, p - r); interleaved min(mv, (v-1)p + 2(p-1-r) + 1) chunks of layers / v."""
    p, m, v = layout.pp, layout.micro, layout.v
    if layout.schedule == "gpipe":
        return m
    if v > 1:
        return min(m * v, (v - 1) * p + 2 * (p - 1 - r) + 1) / v
    return min(m, p - r)


def memory_terms(shape: Shape, hw: Hardware, layout: Cut, train: Training) -> dict:
    """Bytes on the fullest GPU: state, gathered layers, activations, the loss's peak."""
    tp, d = layout.tp, layout.dp_shard
    per_rank = rank_layers(shape, layout)
    p = layout.pp
    h, kv, f = shape.hidden, shape.kv_width, shape.ffn
    tokens_mb = train.local_batch // layout.micro * train.seq_len
    saved = saved_per_token(shape, train)
    # one layer live in backward (its activations and their gradients), sharded t ways but
    # for the inputs that sequence parallelism gathers whole (attention's, the MLP's)
    elem = 1 if train.float8 else 2
    working = (2 * (6 * h + 2 * kv + 4 * f) + 2 * 2 * h) / tp + (2 * h * elem if tp > 1 else 0)
    out = {}
    for r, layers in enumerate(per_rank):
        first, last = r == 0, r == p - 1
        params = layers * shape.layer_params
        params += shape.embedding_params if first else 0
        params += shape.head_params if last else 0
        state = params / (tp * d) * (2 if train.lora else 4 + 4 + 8)
        if p > 1:  # a stage's layers stay gathered, gradients accumulated unsharded in fp32
            weight = 1 if train.fp8_gather else 2
            gathered = params / tp * (weight + 4) if d > 1 else 0.0
            flight = in_flight(layout, r)
        else:  # two layers gathered (the one computing, the one prefetched) with their
            # gradients in bf16 and fp32, and the root's embedding and lm_head
            root = (shape.embedding_params + shape.head_params) / tp
            layers_gathered = 2 * shape.layer_params / tp * (2 + 2 + 4)
            gathered = layers_gathered + root * 2 + shape.head_params / tp * 6 if d > 1 else 0.0
            flight = 1
        acts = layers * flight * tokens_mb * saved / tp
        if p > 1:  # each chunk-micro-batch's stage output, kept until its backward (torch's
            # PipelineStage; measured: benchmarks/results/2026-12-06-cpu/pp_memory); the last
            # stage's is the logits (the peak term), one chunk in flight at a time
            kept = flight * layout.v - (1 if last else 0)
            acts += kept * tokens_mb * 2 * h / tp
        peak = tokens_mb * working
        if last:
            per_logit = LOSS[train.loss][1]
            peak += tokens_mb * shape.vocab / tp * per_logit
        total = state + gathered + acts + peak
        if not out or total > out["total_bytes"]:
            out = {
                "rank": r,
                "state_bytes": state,
                "gathered_bytes": gathered,
                "activation_bytes": acts,
                "peak_bytes": peak,
                "total_bytes": total,
            }
    return out


def predict(shape: Shape, hw: Hardware, layout: Cut, train: Training) -> dict:
    """One step on N GPUs: seconds by term, tokens/s per GPU, memory of the fullest GPU."""
    check(shape, layout, train)
    tp, p, m, v = layout.tp, layout.pp, layout.micro, layout.v
    tokens_mb = train.local_batch // m * train.seq_len
    layer = layer_terms(shape, hw, train, tokens_mb, tp)
    per_rank = rank_layers(shape, layout)
    head = head_s(shape, hw, tokens_mb, tp, train)
    tp_comm, tp_exposed = tp_terms(shape, hw, layout, train, tokens_mb, layer)
    per_layer = layer["total_s"] + tp_exposed
    # the slowest rank's micro-batch (the last one also runs lm_head and the loss)
    busiest = max(n * per_layer + (head if r == p - 1 else 0.0) for r, n in enumerate(per_rank))
    layers_here = max(per_rank)
    if p > 1:
        work = busiest * m
        idle = work * bubble(p, m, v) / (1 - bubble(p, m, v))
        # activations (sequence-sharded under TP) to the next stage and gradients back
        act = tokens_mb * shape.hidden * 2 / tp
        p2p = (m * v + p - 1) * 2 * act / (hw.bus_gbps(True) * 1e9)
    else:
        work, idle, p2p = busiest * m, 0.0, 0.0
    rank_params = layers_here * shape.layer_params + shape.head_params
    adamw = FUSED_ADAMW_BYTES if train.fused_optimizer else ADAMW_BYTES
    opt = rank_params / (tp * layout.dp_shard) * (adamw + CLIP_BYTES) / hw.memory_bytes_s()
    opt = 0.0 if train.lora else opt  # the adapters' update: ~0.1% of the weights
    fsdp = fsdp_terms(shape, hw, layout, train, layers_here, layer)
    # what compute loses to the collectives it hides: NCCL's CTAs hold an SM each while they
    # run, so the compute under them runs on the rest (Hardware.collective_sm_share). FSDP's
    # alone: plain TP hides nothing, and async TP moves its pieces with the copy engines
    # (symmetric memory), not NCCL's SMs
    hidden = fsdp["fsdp_comm_s"] - fsdp["fsdp_exposed_s"]
    shared = max(hidden, 0.0) * hw.collective_sm_share
    step = work + idle + p2p + opt + fsdp["fsdp_exposed_s"] + fsdp["fsdp_copies_s"] + shared
    tokens_gpu = train.local_batch * train.seq_len / (tp * p)
    mem = memory_terms(shape, hw, layout, train)
    n_mb = m * layers_here
    terms = {
        "matmul_s": layer["matmul_s"] * n_mb,
        "recompute_s": layer["recompute_s"] * n_mb,
        "attention_s": layer["attention_s"] * n_mb,
        "memory_bound_s": layer["memory_bound_s"] * n_mb,
        "float8_casts_s": layer["float8_casts_s"] * n_mb,
        "head_s": head * m,
        "tp_exposed_s": tp_exposed * n_mb,
        "pp_bubble_s": idle,
        "pp_p2p_s": p2p,
        "optimizer_s": opt,
        "fsdp_exposed_s": fsdp["fsdp_exposed_s"],
        "fsdp_copies_s": fsdp["fsdp_copies_s"],
        "collective_sms_s": shared,
    }
    return {
        "layout": layout.describe(),
        "step_s": step,
        "tps_per_gpu": tokens_gpu / step,
        "memory_bytes": mem["total_bytes"],
        "memory_gib": mem["total_bytes"] / 2**30,
        "fits": mem["total_bytes"] <= hw.usable_bytes,
        "terms": terms,
        "tp_comm_s": tp_comm * n_mb,
        "fsdp_comm_s": fsdp["fsdp_comm_s"],
        "memory": mem,
        "mfu": 0.0 if train.float8 else _mfu(shape, hw, train, tokens_gpu / step),
    }


def _mfu(shape: Shape, hw: Hardware, train: Training, tps: float) -> float:
    """torchtitan's MFU: (6 N + 12 L h s) per token against the bf16 peak (N without the
    embedding table)."""
    n = shape.params - shape.embedding_params
    per_token = 6 * n + 12 * shape.layers * shape.hidden * train.seq_len
    return tps * per_token / (hw.bf16_tflops * 1e12)
