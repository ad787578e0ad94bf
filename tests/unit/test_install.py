"""The install check (paratrain/install.py): its rules on faked versions and import outcomes
(each can fail), the real check on this machine, and its line in a failed run's report."""

import json

import pytest

from paratrain import errors, install
from paratrain.cli import add_install_notes
from paratrain.launch import job

TRITON_PIN = 'triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"'


def test_a_cuda_torchvision_beside_a_cpu_torch_is_named_with_its_mend():
    (line,) = install.torchvision_problems("2.14.1+cpu", "0.29.1+cu130")
    assert line.startswith("install: torchvision 0.29.1+cu130 is a CUDA 13.0 build")
    assert "torch 2.14.1+cpu, a CPU build" in line
    assert line.endswith(
        'mend: pip install --force-reinstall --no-deps "torchvision==0.29.*" '
        "--index-url https://download.pytorch.org/whl/cpu"
    )
    assert line.count("\n") == 0


def test_a_torchvision_of_another_release_and_a_missing_one():
    (line,) = install.torchvision_problems("2.11.0+cu130", "0.29.1+cu130")
    assert "not released with torch 2.11.0+cu130 (that is torchvision 0.26)" in line
    assert '"torchvision==0.26.*" --index-url https://download.pytorch.org/whl/cu130' in line
    both = install.torchvision_problems("2.11.0+cu128", "0.29.1+cpu")
    assert len(both) == 2
    (missing,) = install.torchvision_problems("2.5.1", None)
    assert "torchvision is not installed" in missing
    assert missing.endswith('"torchvision==0.20.*"')  # an untagged torch: PyPI, no index url


def test_a_matching_pair_is_sound():
    assert install.torchvision_problems("2.11.0+cu130", "0.26.0+cu130") == []
    assert install.torchvision_problems("2.14.1+cpu", "0.29.1+cpu") == []
    assert install.torchvision_problems("2.14.1", "0.29.0a0") == []  # a source build: no tags


def test_triton_and_the_cuda_libraries_against_torchs_pins():
    requires = [
        "filelock",
        "sympy>=1.13.3",
        TRITON_PIN,
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
        'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Windows"',  # not for this machine
        'optree>=0.13.0; extra == "optree"',
    ]
    have = {"filelock": "3.0", "sympy": "1.0", "triton": "3.7.1", "nvidia-nccl-cu13": None}
    lines = install.requirement_problems("2.14.1+cu130", requires, have)
    assert lines == [
        "install: triton 3.7.1 does not match torch 2.14.1+cu130's triton~=3.8.0; "
        'mend: pip install "triton~=3.8.0"',
        "install: nvidia-nccl-cu13 is missing; torch 2.14.1+cu130 needs "
        'nvidia-nccl-cu13==2.30.7; mend: pip install "nvidia-nccl-cu13==2.30.7"',
    ]
    have |= {"triton": "3.8.0", "nvidia-nccl-cu13": "2.30.7"}
    assert install.requirement_problems("2.14.1+cu130", requires, have) == []
    # an image's own CUDA libraries, loaded on its GPU: a missing nvidia-* package is no problem,
    # a triton or nvidia-* package of another version still is
    have |= {"nvidia-nccl-cu13": None}
    assert install.requirement_problems("2.14.1+cu130", requires, have, libraries_load=True) == []
    have |= {"triton": "3.7.1"}
    (line,) = install.requirement_problems("2.14.1+cu130", requires, have, libraries_load=True)
    assert line.startswith("install: triton 3.7.1 does not match")
    assert len(install.requirement_problems("2.14.1+cu130", requires, have, False)) == 2


def test_torchvision_ops_that_do_not_run_and_cuda_libraries_that_do_not_load():
    error = "RuntimeError: operator torchvision::nms does not exist"
    line = install.ops_problem("2.14.1+cpu", "0.29.1", error)
    assert f"compiled ops do not run beside torch 2.14.1+cpu ({error})" in line
    assert "--index-url https://download.pytorch.org/whl/cpu" in line
    assert install.ops_problem("2.14.1+cpu", "0.29.1", None) is None
    cuda = install.cuda_problem("2.11.0+cu130", "OSError: libcudnn.so.9: cannot open shared")
    assert 'pip install --force-reinstall "torch==2.11.0" --index-url' in cuda
    assert install.cuda_problem("2.11.0+cu130", None) is None


def test_only_a_failure_that_looks_like_the_install_runs_the_check(monkeypatch):
    def probe():
        raise AssertionError("probed")

    monkeypatch.setattr(install, "probe", probe)
    assert install.explain("ValueError", "Traceback ...\nValueError: the batch was odd") == []
    assert install.looks_like_install("RuntimeError", "operator torchvision::nms does not exist")
    assert install.looks_like_install("ModuleNotFoundError", "Could not import module 'X'")
    # the check failing itself never hides the failure's own report
    assert install.explain("ImportError", "cannot import name") == []


def test_the_install_here_is_sound():
    """The real check on this machine: versions read, nms run (and the CUDA libraries loaded
    where torch is a CUDA build beside a GPU)."""
    assert install.probe() == []
    assert install.summary().startswith("torch ")


def _chained_import_failure() -> ImportError:
    """transformers' lazy import over a torchvision whose ops did not register."""
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as cause:
            raise ModuleNotFoundError("Could not import module 'LlamaConfig'") from cause
    except ModuleNotFoundError as e:
        return e


def test_a_failed_runs_report_names_the_cause_and_the_installs_mend(tmp_path, monkeypatch, capsys):
    mend = "install: torchvision 0.29.1+cu130 is a CUDA 13.0 build beside torch ...; mend: pip"
    monkeypatch.setattr(install, "probe", lambda: [mend])
    where = tmp_path / "launch"
    where.mkdir()
    errors.record_failure(where, 0, _chained_import_failure())
    assert job.outcome(where, str(tmp_path / "run")) == 1
    report = capsys.readouterr().err.splitlines()
    assert report[0] == (
        "paratrain: rank 0 failed first: ModuleNotFoundError: Could not import module 'LlamaConfig'"
    )
    assert "  caused by RuntimeError: operator torchvision::nms does not exist" in report
    assert report[-1] == mend
    saved = json.loads(next(where.glob("failure_rank_*.json")).read_text())
    assert "torchvision::nms" in saved["traceback"]


def test_a_one_process_failure_gets_the_same_lines(monkeypatch):
    monkeypatch.setattr(install, "probe", lambda: ["install: triton 3.7.1 ...; mend: pip"])
    e = _chained_import_failure()
    add_install_notes(e)
    if hasattr(e, "add_note"):
        assert e.__notes__ == ["install: triton 3.7.1 ...; mend: pip"]
    plain = ValueError("the batch was odd")
    add_install_notes(plain)
    assert not getattr(plain, "__notes__", None)


def test_the_root_of_a_chain_and_a_suppressed_one():
    def fail(suppress: bool):
        try:
            {}["x"]
        except KeyError as e:
            if suppress:
                raise ValueError("outer") from None
            raise ValueError("outer") from e

    for suppress, root in ((False, "KeyError: 'x'"), (True, None)):
        with pytest.raises(ValueError) as caught:
            fail(suppress)
        assert errors.root_cause(caught.value) == root
    assert errors.root_cause(ValueError("alone")) is None


def _planted_torchvision(tmp_path, version: str):
    """A torchvision on the path whose import fails as one of another build does."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "version.py").write_text(f"__version__ = '{version}'\n")
    (pkg / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )


def _check_with(tmp_path):
    import os
    import subprocess
    import sys

    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "paratrain.install"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_real_check_over_a_planted_torchvision_of_another_build(tmp_path):
    import torch

    other = "cpu" if install.local_tag(torch.__version__) != "cpu" else "cu130"
    pair = install.paired_torchvision(torch.__version__)
    _planted_torchvision(tmp_path, f"{pair}.0+{other}")
    proc = _check_with(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"install: torchvision {pair}.0+{other} is ")
    assert f'"torchvision=={pair}.*"' in line and "--no-deps" in line


def test_the_real_check_runs_torchvisions_ops(tmp_path):
    import torch

    pair, tag = install.paired_torchvision(torch.__version__), install.local_tag(torch.__version__)
    _planted_torchvision(tmp_path, f"{pair}.0" + (f"+{tag}" if tag else ""))
    proc = _check_with(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert "compiled ops do not run" in line
    assert "RuntimeError: operator torchvision::nms does not exist" in line


def test_a_torchao_built_for_another_torch_is_named_with_its_mend():
    said = [
        "Failed to load /x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: "
        "/x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c10",
        "Failed to load /x/torchao/_C_cutlass_90a.abi3.so: undefined symbol: _ZN2at",
    ]
    line = install.torchao_problem("2.13.0+cpu", "0.18.0", said)
    assert line.startswith(
        "install: torchao 0.18.0's compiled kernels (_C_cutlass_90a, _C_mxfp8) do not load "
        "beside torch 2.13.0+cpu (_C_mxfp8: undefined symbol: _ZN3c10): it was built for "
        "another torch"
    )
    assert line.endswith(
        "mend: pip install --force-reinstall --no-deps torchao "
        "--index-url https://download.pytorch.org/whl/cpu"
    )
    # before 0.17 a torchao release was built for one torch release: that one is named
    skipped = ["Skipping import of cpp extensions due to incompatible torch version 2.9.1"]
    line = install.torchao_problem("2.10.0+cu128", "0.15.0", skipped)
    assert "0.15.0's compiled kernels are skipped beside torch 2.10.0+cu128" in line
    assert line.endswith('mend: pip install --force-reinstall --no-deps "torchao==0.16.0"')
    assert install.mend_torchao("2.9.0").endswith('"torchao==0.14.1"')
    crashed = ["Failed to import torchao: torchao ended the interpreter (killed by SIGABRT)"]
    assert " does not import beside torch" in install.torchao_problem("2.9.0", "0.13.0", crashed)
    assert install.torchao_problem("2.14.1", "0.18.0", ["something else it said"]) is None


def test_a_triton_that_does_not_import_is_named_with_torchs_pin():
    error = "ImportError: libtriton.so: cannot open shared object file"
    line = install.triton_problem("2.14.1+cu130", "3.8.0", error, [TRITON_PIN])
    assert line == (
        f"install: triton 3.8.0 does not import beside torch 2.14.1+cu130 ({error}); "
        'mend: pip install --force-reinstall --no-deps "triton~=3.8.0"'
    )
    assert install.triton_problem("2.14.1+cpu", "3.8.0", error, []).endswith('"triton==3.8.0"')
    assert install.triton_problem("2.14.1+cpu", "3.8.0", None, [TRITON_PIN]) is None


def _plant(where, name: str, init: str) -> None:
    (where / name).mkdir()
    (where / name / "__init__.py").write_text(init)


TORCHAO_SAYS = (
    "import logging\n"
    "log = logging.getLogger(__name__)\n"
    "for so in ('_C_mxfp8.cpython-310-x86_64-linux-gnu.so', '_C_cutlass_90a.abi3.so'):\n"
    "    log.warning(f'Failed to load /x/torchao/{so}: undefined symbol: _ZN3c10')\n"
)


def test_the_real_check_imports_triton_and_torchao(tmp_path):
    """Metadata says nothing of an import that fails: the check imports triton and torchao in
    a child process; a crash there (SIGKILL, as an ABI mismatch aborts) is laid at the import
    running."""
    _plant(tmp_path, "triton", "raise ImportError('libtriton.so: cannot open shared object')\n")
    _plant(tmp_path, "torchao", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = _check_with(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    triton, torchao = proc.stdout.splitlines()
    assert triton.startswith("install: triton") and "does not import beside torch" in triton
    assert "(ImportError: libtriton.so: cannot open shared object)" in triton
    assert 'mend: pip install --force-reinstall --no-deps "triton' in triton
    assert torchao.startswith("install: torchao") and " does not import beside torch" in torchao
    assert "(torchao ended the interpreter (killed by SIGKILL))" in torchao
    assert "mend: pip install --force-reinstall --no-deps" in torchao


def test_torchaos_failed_kernels_are_one_line_where_paratrain_imports_it(tmp_path):
    """torchao prints a warning per kernel that did not load in every process that imports
    it; under paratrain one line says what it means and where the mend is."""
    import os
    import subprocess
    import sys

    _plant(tmp_path, "torchao", TORCHAO_SAYS)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items() if k != "RANK"} | {"PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-c", "import paratrain, torchao, importlib; importlib.reload(torchao)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "torchao's compiled kernels do not load" in line and "paratrain does not use" in line
    assert "python -m paratrain.install" in line
    # rank 1 says nothing: rank 0 says it for the run
    env["RANK"] = "1"
    code = "import paratrain, torchao"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_a_run_over_a_broken_torchvision_says_the_install_line_not_the_fork_servers(tmp_path):
    """A torchvision model on two CPU processes over a torchvision whose ops do not load: the
    fork server imports torchvision before forking the workers; its failure is the run's one
    report with the install check's line and mend, not the fork server's traceback and
    torchrun's "EOFError: unexpected EOF"."""
    import os
    import subprocess
    import sys

    import torch

    pair, tag = install.paired_torchvision(torch.__version__), install.local_tag(torch.__version__)
    _planted_torchvision(tmp_path, f"{pair}.0" + (f"+{tag}" if tag else ""))
    settings = ["task=image_classification", "device=cpu", "strategy=ddp-ds"]
    settings += ["model.name=mobilenet_v2", "data.source=synthetic", "data.image_size=32"]
    settings += ["data.num_workers=0", "train.max_steps=1", f"output_dir={tmp_path / 'run'}"]
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "run", "--nproc", "2"]
        + [a for s in settings for a in ("--set", s)],
        env={**os.environ, "PYTHONPATH": path, "PARATRAIN_FORKSERVER": ""},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "EOFError" not in out and "Traceback" not in out, out
    assert "forkserver" not in out, out
    (line,) = [x for x in out.splitlines() if x.startswith("install: ")]
    assert "compiled ops do not run" in line and "mend: pip install" in line
