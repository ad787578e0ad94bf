"""Hardware profiles for `paratrain plan` without a GPU: a GPU's datasheet rates, its
node, its links, and the derating that turns a datasheet rate into the rate a training step
gets, each with where it comes from. Profiles are TOML files: the shipped ones in
forecast/profiles/ (`--hardware h100-sxm`), or any path (a profile a device call wrote, see
benchmarks/device/analytic_plan_calibration.sh)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from paratrain.errors import UserError

PROFILES = Path(__file__).parents[1] / "profiles"


@dataclass(frozen=True)
class Hardware:
    """Datasheet rates (dense TFLOP/s, GiB, TB/s, W, GB/s a GPU each way) and derating: the
    achieved fraction of each rate, stated in the profile with its source."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    memory_gib: float
    memory_tbps: float
    power_w: float
    rated_power_w: float
    gpus_per_node: int
    intra_gbps: float
    inter_gbps: float
    matmul: float
    matmul_fp8: float
    attention_hd64: float
    attention_hd128: float
    memory: float
    intra: float
    inter: float
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    # A power-limited GPU's power against its clock: P = static_w + k f^power_exponent. The
    # defaults are DVFS's textbook rule (no static power, V ~ f so P ~ f^3); a profile whose
    # power_w is below its rated_power_w states what was measured instead.
    static_w: float = 0.0
    power_exponent: float = 3.0
    path: str = ""  # the file it was read from
    rates_path: str = ""
    """[tables] rates: a table of GEMM and attention rates by shape measured on this GPU
    (rates.py); without one, the derates above price every matmul alike."""
    attention_backend: str = "flash"
    """Which of the table's attention kernels a step runs (sdpa's flash: torchtitan's)."""
    latency_intra_us: float = 0.0
    latency_inter_us: float = 0.0
    """[collectives]: a collective's fixed time within a node and across nodes (nccl-tests'
    time at its smallest sizes), added to its size over the bus bandwidth."""
    channels: int = 0
    sms: int = 0
    """[collectives] channels and sms: NCCL runs a collective as one CTA a channel, each on an
    SM of its own that no compute kernel shares, so compute under a collective runs on
    sms - channels SMs (0: not modelled)."""

    @property
    def collective_sm_share(self) -> float:
        """The share of the GPU's SMs a running collective holds (channels / sms)."""
        return self.channels / self.sms if self.sms else 0.0

    @property
    def rates(self):
        from paratrain.forecast.analytic import rates

        return rates.load(self.rates_path) if self.rates_path else None

    def gemm_s(self, m: float, n: float, k: float, float8: bool = False) -> float:
        """Seconds of one (M, N, K) GEMM: at its own measured rate where the profile has a
        table (at this profile's clock), else at the one derated rate."""
        flops = 2 * m * n * k
        table, dtype = self.rates, "float8" if float8 else "bf16"
        if table is None or not table.gemm.get(dtype):  # the derate prices what it lacks
            return flops / self.matmul_flops(float8)
        if float8 and not self.fp8_tflops:
            raise UserError(f"hardware {self.name}: no float8 matmuls on this GPU")
        rate = table.gemm_tflops(m, n, k, dtype)
        return flops / (rate * 1e12 * self.clock)

    def attention_s(
        self, head_dim: int, heads: float, seq: int, tokens: float, backend: str | None = None
    ) -> tuple[float, float]:
        """(forward, backward) seconds of causal attention over `tokens` tokens in sequences of
        `seq`, `heads` heads of `head_dim` on this GPU, with sdpa's `backend` (flash, cudnn, or their _gqa rows;
        default the profile's): forward 2 tokens seq heads head_dim FLOPs (the causal half),
        backward 2.5 times that."""
        flops = 2 * tokens * seq * heads * head_dim
        table = self.rates
        if table is None:
            rate = self.attention_flops(head_dim)
            return flops / rate, 2.5 * flops / rate
        fwd, bwd = table.attention_tflops(head_dim, heads, seq, backend or self.attention_backend)
        return flops / (fwd * 1e12 * self.clock), 2.5 * flops / (bwd * 1e12 * self.clock)

    @property
    def clock(self) -> float:
        """The compute rates' share left below the rated power: the clock at which the
        matmuls draw power_w, of the clock at which they draw rated_power_w (where the rates
        were measured), ((P - P_static) / (P_rated - P_static))^(1 / n)."""
        if self.power_w >= self.rated_power_w:
            return 1.0
        dynamic = (self.power_w - self.static_w) / (self.rated_power_w - self.static_w)
        return dynamic ** (1 / self.power_exponent)

    def matmul_flops(self, float8: bool = False) -> float:
        """Achieved matmul FLOP/s of a training step's GEMMs."""
        if float8:
            if not self.fp8_tflops:
                raise UserError(f"hardware {self.name}: no float8 matmuls on this GPU")
            return self.fp8_tflops * 1e12 * self.matmul_fp8 * self.clock
        return self.bf16_tflops * 1e12 * self.matmul * self.clock

    def attention_flops(self, head_dim: int) -> float:
        """Achieved FLOP/s of flash attention's forward + backward (bf16), by head dim: the
        profile's two points, linear between them, held beyond."""
        lo, hi = self.attention_hd64, self.attention_hd128
        share = lo + (hi - lo) * min(max((head_dim - 64) / 64, 0.0), 1.0)
        return self.bf16_tflops * 1e12 * share * self.clock

    def memory_bytes_s(self) -> float:
        """Achieved HBM bytes/s of the memory-bound kernels."""
        return self.memory_tbps * 1e12 * self.memory

    def bus_gbps(self, inter_node: bool, per_node: int = 1) -> float:
        """All-gather / reduce-scatter bus bandwidth a group gets, GB/s (nccl-tests' busbw):
        NVLink's within a node; across nodes each of the group's GPUs on a node drives its own
        NIC (NCCL runs a ring a NIC), so the NICs' rate x the group's GPUs a node, at most
        NVLink's (a ring over nodes runs at its slowest hop)."""
        nvlink = self.intra_gbps * self.intra
        if not inter_node:
            return nvlink
        return min(self.inter_gbps * self.inter * max(per_node, 1), nvlink)

    def collective_s(
        self, whole_bytes: float, n: int, kind: str = "all_gather", *, per_node: int
    ) -> float:
        """Seconds of one collective over n GPUs, per_node of them on each node (n where the
        group fits in one): the profile's latency plus its size over the bus bandwidth
        (whole_bytes: the gathered tensor, or the tensor reduced; nccl-tests' size)."""
        if n <= 1:
            return 0.0
        from paratrain.forecast.calibrated.model import collective_s

        inter = n > per_node
        latency = self.latency_inter_us if inter else self.latency_intra_us
        return collective_s(whole_bytes, n, self.bus_gbps(inter, per_node), kind) + latency * 1e-6

    @property
    def usable_bytes(self) -> float:
        return self.memory_gib * 2**30


_NUMBERS = (
    "bf16_tflops",
    "fp8_tflops",
    "memory_gib",
    "memory_tbps",
    "power_w",
    "rated_power_w",
    "intra_gbps",
    "inter_gbps",
)
_DERATES = ("matmul", "matmul_fp8", "attention_hd64", "attention_hd128", "memory", "intra", "inter")


def names() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.toml"))


def load(name_or_path: str) -> Hardware:
    """A shipped profile by name, or a profile file by path; one line on a bad one."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES / f"{name_or_path}.toml"
    if not path.is_file():
        raise UserError(
            f"--hardware: no profile {name_or_path!r}; shipped: {', '.join(names())}, or a "
            ".toml file's path"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"--hardware: {path} is not TOML ({e})") from None
    return from_dict(data, str(path))


def _number(table: dict, key: str, name: str, where: str):
    """A profile's value as a float (a text value such as gpus_per_node's stays as it is
    where it is no number: only the numbers the plan reads are asked to be)."""
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        if key in (*_NUMBERS, *_DERATES, "static_w", "exponent"):
            raise UserError(f"hardware profile {where}: {name} must be a number, got {value!r}")
        return value
    return float(value)


def _power_curve(power, sheet: dict, where: str) -> tuple[float, float]:
    """[power]'s static_w and exponent, checked (the cube-root rule where it is absent)."""
    for key in ("power_w", "rated_power_w"):
        if not sheet[key] > 0:
            raise UserError(f"hardware profile {where}: datasheet.{key} must be above 0")
    if not isinstance(power, dict) or set(power) - {"static_w", "exponent"}:
        raise UserError(f"hardware profile {where}: [power] holds static_w and exponent only")
    static, exponent = power.get("static_w", 0.0), power.get("exponent", 3.0)
    below = min(sheet["power_w"], sheet["rated_power_w"])
    if not 0 <= static < below:
        raise UserError(f"hardware profile {where}: power.static_w must lie in [0, {below:g})")
    if not (math.isfinite(exponent) and exponent > 0):
        raise UserError(f"hardware profile {where}: power.exponent must be a number above 0")
    return static, exponent


def _tables(tables, where: str) -> tuple[str, str]:
    """[tables]: the rates table's path (beside the profile unless a path says otherwise) and
    the attention kernel a step runs."""
    if not isinstance(tables, dict) or set(tables) - {"rates", "attention_backend"}:
        raise UserError(f"hardware profile {where}: [tables] holds rates and attention_backend")
    path = str((Path(where).parent / str(tables["rates"])).resolve()) if "rates" in tables else ""
    return path, str(tables.get("attention_backend", "flash"))


def _collectives(table, where: str) -> dict:
    """[collectives]: latency_intra_us and latency_inter_us, each a number >= 0 (0 where
    absent: size over bandwidth alone); channels and sms, whole numbers (0 where absent:
    collectives take no SMs from compute), channels below sms."""
    keys = ("latency_intra_us", "latency_inter_us", "channels", "sms")
    if not isinstance(table, dict) or set(table) - set(keys):
        raise UserError(f"hardware profile {where}: [collectives] holds {', '.join(keys)}")
    out = {}
    for key in keys:
        value = table.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise UserError(f"hardware profile {where}: collectives.{key} must be a number >= 0")
        if key in ("channels", "sms") and not (math.isfinite(value) and value == int(value)):
            raise UserError(f"hardware profile {where}: collectives.{key} must be a whole number")
        out[key] = float(value) if key.startswith("latency") else int(value)
    if out["channels"] and not out["channels"] < out["sms"]:
        raise UserError(f"hardware profile {where}: collectives.channels must be below sms")
    return out


def from_dict(data: dict, where: str = "profile") -> Hardware:
    sheet, derate = data.get("datasheet", {}), data.get("derate", {})
    missing = [k for k in _NUMBERS if k not in sheet] + [k for k in _DERATES if k not in derate]
    if missing:
        raise UserError(f"hardware profile {where}: missing {', '.join(missing)}")
    power = data.get("power", {})
    sheet = {k: _number(sheet, k, f"datasheet.{k}", where) for k in sheet}
    derate = {k: _number(derate, k, f"derate.{k}", where) for k in derate}
    if isinstance(power, dict):
        power = {k: _number(power, k, f"power.{k}", where) for k in power}
    # a rate the plan divides by must be there; float8's only where the GPU has float8
    bad = [k for k in _DERATES if not 0 < derate[k] <= 1]
    if not sheet["fp8_tflops"] and 0 <= derate["matmul_fp8"] <= 1:
        bad = [k for k in bad if k != "matmul_fp8"]
    if bad:
        raise UserError(f"hardware profile {where}: derate.{bad[0]} must lie in (0, 1]")
    static, exponent = _power_curve(power, sheet, where)
    rates_path, attention_backend = _tables(data.get("tables", {}), where)
    return Hardware(
        **_collectives(data.get("collectives", {}), where),
        rates_path=rates_path,
        attention_backend=attention_backend,
        name=data.get("name", Path(where).stem),
        path=where,
        static_w=static,
        power_exponent=exponent,
        description=data.get("description", ""),
        gpus_per_node=int(sheet.get("gpus_per_node", 8)),
        sources=dict(data.get("sources", {})),
        **{k: sheet[k] for k in _NUMBERS},
        **{k: derate[k] for k in _DERATES},
    )
