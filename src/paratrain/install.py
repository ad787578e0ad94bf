"""Is the install itself sound? torch, torchvision, triton and the CUDA libraries that torch's
wheel pins, each against the others: pip can end (exit 0) with a torchvision built for CUDA
beside a CPU torch, and the first sign is then a failing import far from the cause
("operator torchvision::nms does not exist", transformers' "Could not import module
'LlamaConfig'").

The rules are pure functions of version strings and import outcomes (unit-tested with faked
ones); probe() feeds them this machine's. Each problem is one line naming the package and the
pip command that mends it. `paratrain doctor` prints them first; a run whose worker failed in
a way an install explains (explain()) adds them to its one report (job.py, cli/__init__.py).
Imports no part of paratrain: the launching command's failure report reads it.
"""

from __future__ import annotations

import contextlib
import re

PYTORCH_INDEX = "https://download.pytorch.org/whl/"
# torchvision 0.15 came with torch 2.0; every torch 2.x release since has its torchvision 0.(x+15)
TORCHVISION_OFFSET = 15
# what a failure's traceback says when the install, not the run, is the cause
INSTALL_SIGNS = re.compile(
    r"torchvision::|Could not import module|undefined symbol|cannot open shared object|"
    r"lib(cudart|cublas|cudnn|nccl|nvrtc|cusparse|nvJitLink)[\w.]*|No module named 'triton|"
    r"Detected that PyTorch and torchvision were compiled with different CUDA"
)
FAILED_IMPORT = ("ImportError", "ModuleNotFoundError", "OSError")


def local_tag(version: str) -> str:
    """The build a version names after '+': 'cpu', 'cu130', 'rocm6.4', or '' (none said)."""
    return version.partition("+")[2]


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as 2.14.1+cpu or 0.29.0a0."""
    parts = re.findall(r"\d+", version.partition("+")[0])[:2]
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (0, 0)


def build_name(tag: str) -> str:
    if tag == "cpu":
        return "a CPU build"
    if tag.startswith("cu") and tag[2:].isdigit():
        return f"a CUDA {tag[2:-1]}.{tag[-1]} build"
    return f"a {tag} build" if tag else "a build of unnamed kind"


def index_url(torch_version: str) -> str:
    """pip's --index-url for wheels of torch's own build ('' for an untagged torch: PyPI)."""
    tag = local_tag(torch_version)
    return f" --index-url {PYTORCH_INDEX}{tag}" if tag else ""


def paired_torchvision(torch_version: str) -> str | None:
    """The torchvision release made with this torch ('0.29' for 2.14), None outside torch 2."""
    major, minor = release(torch_version)
    return f"0.{minor + TORCHVISION_OFFSET}" if major == 2 else None


def mend_torchvision(torch_version: str) -> str:
    """Reinstall torchvision alone (--no-deps leaves torch as it is), of torch's build and pair."""
    pair = paired_torchvision(torch_version)
    spec = f'"torchvision=={pair}.*"' if pair else "torchvision"
    return f"pip install --force-reinstall --no-deps {spec}{index_url(torch_version)}"


def torchvision_problems(torch_version: str, tv_version: str | None) -> list[str]:
    """torchvision's build (+cpu / +cuXXX) and release against torch's."""
    mend = mend_torchvision(torch_version)
    if tv_version is None:
        return [f"install: torchvision is not installed (paratrain needs it); mend: {mend}"]
    out = []
    tag, tv_tag = local_tag(torch_version), local_tag(tv_version)
    if tag and tv_tag and tag != tv_tag:
        out.append(
            f"install: torchvision {tv_version} is {build_name(tv_tag)} beside torch "
            f"{torch_version}, {build_name(tag)}: its compiled ops will not load; mend: {mend}"
        )
    pair = paired_torchvision(torch_version)
    if pair and ".".join(map(str, release(tv_version))) != pair:
        out.append(
            f"install: torchvision {tv_version} was not released with torch {torch_version} "
            f"(that is torchvision {pair}); mend: {mend}"
        )
    return out


def requirement_problems(
    torch_version: str,
    requires: list[str],
    installed: dict[str, str | None],
    libraries_load: bool | None = None,
) -> list[str]:
    """torch's own pins (triton, the nvidia-* CUDA libraries, cuda-toolkit: `==` or `~=` in its
    wheel's metadata, where the marker applies here) against what is installed. `requires` are
    importlib.metadata.requires('torch'); `installed` maps each name to its version or None.
    `libraries_load`: the CUDA libraries loaded on this machine's GPU (None: not tried): then a
    missing nvidia-* / cuda-* package is no problem (the libraries came from elsewhere, an
    image's CUDA), while one of another version still is."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        pinned = any(s.operator in ("==", "~=", "===") for s in req.specifier)
        if not pinned or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        have = installed.get(req.name)
        mend = f'pip install "{req.name}{req.specifier}"'
        if have is None and libraries_load and req.name.startswith(("nvidia-", "cuda-")):
            continue
        if have is None:
            out.append(
                f"install: {req.name} is missing; torch {torch_version} needs "
                f"{req.name}{req.specifier}; mend: {mend}"
            )
        elif not req.specifier.contains(have, prereleases=True):
            out.append(
                f"install: {req.name} {have} does not match torch {torch_version}'s "
                f"{req.name}{req.specifier}; mend: {mend}"
            )
    return out


def ops_problem(torch_version: str, tv_version: str | None, error: str | None) -> str | None:
    """torchvision.ops.nms on a tiny tensor failed with `error` (None: it ran)."""
    if error is None or tv_version is None:
        return None
    return (
        f"install: torchvision {tv_version}'s compiled ops do not run beside torch "
        f"{torch_version} ({error}); mend: {mend_torchvision(torch_version)}"
    )


def cuda_problem(torch_version: str, error: str | None) -> str | None:
    """A CUDA build of torch, a GPU present, and its libraries failed with `error`."""
    if error is None:
        return None
    return (
        f"install: torch {torch_version}'s CUDA libraries do not load here ({error}); mend: "
        f'pip install --force-reinstall "torch=={torch_version.partition("+")[0]}"'
        f"{index_url(torch_version)} (or a driver new enough for {build_name(local_tag(torch_version))})"
    )


# ---- this machine's facts ------------------------------------------------------------------


def _file_version(module: str) -> str | None:
    """A package's version.py `__version__`, read without importing the package (importing a
    broken torchvision is what fails): it carries the build tag that pip's metadata may not."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "version.py"
    found = (
        re.search(r"__version__\s*=\s*['\"]([^'\"]+)", path.read_text()) if path.is_file() else None
    )
    if found:
        return found.group(1)
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _run_nms() -> str | None:
    try:
        import torch
        import torchvision

        boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 1.9], [5.0, 5.0, 6.0, 6.0]])
        keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return _first_line(e)
    return None if keep == [0, 2] else f"nms kept boxes {keep}, not [0, 2]"


def _run_cuda() -> str | None:
    """cuBLAS (a matmul), cuDNN (a convolution), NCCL's version: the libraries torch's wheel
    loads lazily, loaded here."""
    import torch

    try:
        torch.cuda.init()
        x = torch.ones(8, 8, device="cuda")
        (x @ x).sum().item()
        torch.nn.functional.conv2d(x[None, None], x[None, None, :3, :3]).sum().item()
        torch.cuda.nccl.version()
    except Exception as e:  # noqa: BLE001
        return _first_line(e)
    return None


def _gpu_present() -> bool:
    from pathlib import Path

    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def probe() -> list[str]:
    """This machine's install checked: one line per problem, [] when sound."""
    from importlib import metadata

    import torch

    tv = _file_version("torchvision")
    out = torchvision_problems(torch.__version__, tv)
    try:
        requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        requires = []
    tried = bool(torch.version.cuda) and _gpu_present()  # the libraries, loaded on the GPU
    cuda_error = _run_cuda() if tried else None
    loads = cuda_error is None if tried else None
    out += requirement_problems(torch.__version__, requires, _installed(requires), loads)
    if not out:  # a mismatch above explains a failing nms; its own line would repeat it
        line = ops_problem(torch.__version__, tv, _run_nms())
        out += [line] if line else []
    line = cuda_problem(torch.__version__, cuda_error)
    return out + ([line] if line else [])


def _installed(requires: list[str]) -> dict[str, str | None]:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    out: dict[str, str | None] = {}
    for line in requires:
        try:
            name = Requirement(line).name
        except InvalidRequirement:
            continue
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def looks_like_install(kind: str, text: str) -> bool:
    """A failure an install can cause: a failed import or a library that did not load."""
    return kind in FAILED_IMPORT or bool(INSTALL_SIGNS.search(text))


def explain(kind: str, text: str) -> list[str]:
    """For a failure (its exception type's name and its traceback, causes included): the
    install's problems when the failure looks like one, else []. Never raises: it runs while
    a failure is being reported."""
    if not looks_like_install(kind, text):
        return []
    try:
        return probe()
    except Exception:  # noqa: BLE001 - the failure's own report goes on without it
        return []


def summary() -> str:
    """One line of the versions checked (doctor's line when nothing is wrong)."""
    from importlib import metadata

    import torch

    parts = [f"torch {torch.__version__}", f"torchvision {_file_version('torchvision')}"]
    with contextlib.suppress(metadata.PackageNotFoundError):
        parts.append(f"triton {metadata.version('triton')}")
    return ", ".join(parts)


if __name__ == "__main__":
    lines = probe()
    print("\n".join(lines) or f"install: sound ({summary()})")
    raise SystemExit(1 if lines else 0)
