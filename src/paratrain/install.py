"""Is the install itself sound? torch, torchvision, triton and the CUDA libraries that torch's
wheel pins, each against the others: pip can end (exit 0) with a torchvision built for CUDA
beside a CPU torch, and the first sign is then a failing import far from the cause
("operator torchvision::nms does not exist", transformers' "Could not import module
'LlamaConfig'").

The rules are pure functions of version strings and import outcomes (unit-tested with faked
ones); probe() feeds them this machine's: the versions from the packages' metadata, and the
imports that metadata cannot vouch for (torchvision's compiled ops run, triton imported,
torchao's compiled kernels loaded) tried in a child process, where a library that crashes
the interpreter takes only the child down. Each problem is one line naming the package and the
pip command that mends it. `paratrain doctor` prints them first; a run whose worker failed in
a way an install explains (explain()) adds them to its one report (job.py, cli/__init__.py).
Imports no part of paratrain: the launching command's failure report reads it.
"""

from __future__ import annotations

import contextlib
import re
import subprocess

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


def triton_problem(
    torch_version: str, have: str | None, error: str | None, requires: list[str]
) -> str | None:
    """triton, installed at version `have`, failed to import with `error` (None: it imported):
    torch.compile and paratrain's kernels import it and fail there, far from the cause."""
    if error is None:
        return None
    spec = _pin("triton", requires) or (f"=={have}" if have else "")
    return (
        f"install: triton{' ' + have if have else ''} does not import beside torch {torch_version} ({error}); "
        f'mend: pip install --force-reinstall --no-deps "triton{spec}"'
    )


# torchao's compiled kernels before 0.17 were built for one torch release each (torchao's
# compatibility table, github.com/pytorch/ao/issues/2919); from 0.17 on they ask torch >= 2.11
TORCHAO_FOR_TORCH = {"2.8": "0.13.0", "2.9.0": "0.14.1", "2.9": "0.15.0", "2.10": "0.16.0"}


def mend_torchao(torch_version: str) -> str:
    """The torchao whose compiled kernels were built for this torch."""
    base = torch_version.partition("+")[0]
    minor = ".".join(map(str, release(torch_version)))
    pair = TORCHAO_FOR_TORCH.get(".".join(base.split(".")[:3])) or TORCHAO_FOR_TORCH.get(minor)
    if pair:
        return f'pip install --force-reinstall --no-deps "torchao=={pair}"'
    return f"pip install --force-reinstall --no-deps torchao{index_url(torch_version)}"


def torchao_problem(torch_version: str, have: str | None, said: list[str]) -> str | None:
    """What torchao's import logged about its compiled kernels (`said`: its warnings, and
    "Failed to import torchao: <error>" where the import itself failed): a kernel that did not
    load ("Failed to load <file>: <error>", a line per file in every process that imports
    torchao), or all of them skipped for a torch it finds incompatible."""
    failed = [m.removeprefix("Failed to load ") for m in said if m.startswith("Failed to load ")]
    skipped = [m for m in said if "incompatible torch" in m]
    broken = [m.partition(": ")[2] for m in said if m.startswith("Failed to import torchao: ")]
    if broken:
        what, why = " does not import", broken[0]
    elif failed:
        path, _, error = failed[0].partition(": ")
        names = sorted({_so_name(m.partition(": ")[0]) for m in failed})
        what = f"'s compiled kernels ({', '.join(names)}) do not load"
        error = (error.strip().splitlines() or [""])[0].removeprefix(f"{path}: ")  # dlopen's
        why = f"{_so_name(path)}: {error[:200]}"
    elif skipped:
        what, why = "'s compiled kernels are skipped", skipped[0].strip().splitlines()[0][:200]
    else:
        return None
    return (
        f"install: torchao{' ' + have if have else ''}{what} beside torch {torch_version} ({why}): it was "
        "built for another torch, and says so in every process that imports it (paratrain's "
        "float8 layers and low-bit optimizers do not use its compiled kernels); "
        f"mend: {mend_torchao(torch_version)}"
    )


def _so_name(path: str) -> str:
    """'/x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so' -> '_C_mxfp8'."""
    return path.rsplit("/", 1)[-1].split(".")[0]


def _pin(name: str, requires: list[str]) -> str:
    """torch's own specifier for `name` ('~=3.8.0'), where its metadata pins it for here."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name == name and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return str(req.specifier)
    return ""


def torch_problem(torch_version: str, error: str | None) -> str | None:
    """torch itself did not import (`error`)."""
    if error is None:
        return None
    return (
        f"install: torch {torch_version} does not import ({error}); mend: pip install "
        f'--force-reinstall "torch=={torch_version.partition("+")[0]}"{index_url(torch_version)}'
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


CRASH = "ended the interpreter"
MARK = "@paratrain.install "
"""A line of the child's outcomes (whatever else the libraries print around it is not read)."""


def _tried_imports(skip: tuple[str, ...] = ()) -> None:
    """In the child process: each import that metadata cannot vouch for (but those in `skip`,
    tried already), its outcome printed as a marked JSON line, ["start", name] before and
    [name, outcome] after, so that a crash is laid at the import that was running."""
    import importlib.util
    import json

    def say(*item) -> None:
        print(MARK + json.dumps(item), flush=True)

    say("start", "torch")
    import torch

    say("torch", torch.__version__)
    # triton first: torchvision and torchao import it, and its failure is then theirs too
    checks = {"triton": _import_triton, "torchvision": _run_nms, "torchao": _import_torchao}
    if torch.version.cuda and _gpu_present():
        checks = {"cuda": _run_cuda, **checks}
    for name, check in checks.items():
        if name not in skip and (name == "cuda" or importlib.util.find_spec(name) is not None):
            say("start", name)
            say(name, check())


def _import_triton() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return _first_line(e)
    return None


def _import_torchao() -> list[str]:
    """torchao's warnings while it is imported (its compiled kernels that did not load), and
    its import's own failure."""
    import logging

    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("torchao")
    log.filters.clear()  # paratrain's own filter (paratrain/__init__.py) would hide them
    log.addHandler(handler)
    log.propagate = False
    try:
        import torchao  # noqa: F401
    except Exception as e:  # noqa: BLE001
        said.append(f"Failed to import torchao: {_first_line(e)}")
    return said


def _import_outcomes(timeout: float = 300) -> dict:
    """_tried_imports in a child process -> {name: outcome}. An import that ended the child (a
    crash in native code) is one outcome; a new child then tries the ones after it. {} when
    the child could not tell (it did not finish in time)."""
    found: dict = {}
    while True:
        try:
            tried, crashed = _one_child(tuple(found), timeout)
        except (OSError, subprocess.TimeoutExpired):
            return found
        found |= tried
        if crashed is None or crashed == "torch":
            return found


def _one_child(skip: tuple[str, ...], timeout: float) -> tuple[dict, str | None]:
    """One child's outcomes, and the check that ended it (None: it ran to its end)."""
    import json
    import sys

    code = f"from paratrain.install import _tried_imports; _tried_imports({skip!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    found, running = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            name, value = json.loads(line[len(MARK) :])
            running, found = (value, found) if name == "start" else (None, found | {name: value})
    if running is None:
        return found, None
    rc = proc.returncode
    last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    how = f"killed by {_signal_name(-rc)}" if rc < 0 else f"exit code {rc}: {last}"
    crash = f"{running} {CRASH} ({how})"
    found[running] = [f"Failed to import torchao: {crash}"] if running == "torchao" else crash
    if running == "torch":
        found["torch"], found["torch_error"] = None, crash
    return found, running


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
    """This machine's install checked: one line per problem, [] when sound. torch itself is
    imported in the child only (this process may be a command that has not imported it)."""
    from importlib import metadata

    imports = _import_outcomes()
    # a triton that crashed the child crashes what imports it after it: its own line says it
    if CRASH in str(imports.get("triton")):
        imports = {k: v for k, v in imports.items() if CRASH not in str(v)} | {
            "triton": imports["triton"]
        }
    torch_version = imports.get("torch") or _file_version("torch") or "(unknown)"
    tv = _file_version("torchvision")
    out = torchvision_problems(torch_version, tv)
    try:
        requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        requires = []
    cuda_error = imports.get("cuda")  # the libraries, loaded on the GPU (where there is one)
    loads = (cuda_error is None) if "cuda" in imports else None
    out += requirement_problems(torch_version, requires, _installed(requires), loads)
    # a mismatch above explains a failing import; its own line would repeat it
    triton_named = any(line.startswith("install: triton ") for line in out)
    lines = [
        None if out else ops_problem(torch_version, tv, imports.get("torchvision")),
        None
        if triton_named
        else triton_problem(torch_version, _version("triton"), imports.get("triton"), requires),
        torchao_problem(torch_version, _version("torchao"), imports.get("torchao") or []),
        cuda_problem(torch_version, cuda_error),
        torch_problem(torch_version, imports.get("torch_error")),
    ]
    return out + [line for line in lines if line]


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


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

    parts = [f"torch {_file_version('torch')}", f"torchvision {_file_version('torchvision')}"]
    for name in ("triton", "torchao"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            parts.append(f"{name} {metadata.version(name)}")
    return ", ".join(parts)


if __name__ == "__main__":
    lines = probe()
    print("\n".join(lines) or f"install: sound ({summary()})")
    raise SystemExit(1 if lines else 0)
