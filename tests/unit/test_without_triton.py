"""A CPU-only install without Triton (torch's CPU wheels ship none): every paratrain module
imports, the plan's automatic levers pick what runs there, and the Triton layers asked for
explicitly fall back to their torch arithmetic. Triton is blocked from import in a fresh
interpreter (this machine's torch has it)."""

import subprocess
import sys
import textwrap

# None in sys.modules: `import triton` raises ImportError and importlib.util.find_spec("triton")
# answers None, as where it is not installed (torch itself asks find_spec)
BLOCK = "import sys\nsys.modules['triton'] = None\n"


def run_without_triton(code: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_module_imports_without_triton():
    out = run_without_triton(
        """
        import importlib, pkgutil
        import paratrain

        names = [m.name for m in pkgutil.walk_packages(paratrain.__path__, "paratrain.")]
        names = [n for n in names if not n.endswith("__main__")]  # a script: it would run
        optional = []
        for name in names:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:  # a peer of an optional library (torchtitan)
                assert e.name and not e.name.startswith("triton"), (name, e)
                optional.append(name)
        assert all(".peers.torchtitan_" in n for n in optional), optional  # torchtitan's own
        assert sys.modules["triton"] is None
        from paratrain import kernels
        assert kernels.triton is None and kernels.block_index is None
        print(len(names), "modules")
        """
    )
    assert int(out.split()[0]) > 100


def test_a_tiny_run_with_the_triton_layers_asked_for_takes_torchs_arithmetic(tmp_path):
    out = run_without_triton(
        f"""
        from paratrain.cli import main
        from paratrain.runplan import plan_of

        sets = ["model.name=mobilenet_v2", "model.depthwise_conv=triton", "model.batchnorm=triton",
                "model.shift_add_min_side=0", "train.channels_last=true", "data.image_size=32",
                "data.limit_samples=64", "data.batch_size=16", "data.num_workers=0",
                "train.max_steps=2", "train.eval=false", "checkpoint.at_end=false",
                "log.progress=false", "strategy=single"]
        plan = plan_of("recipes/tiny_cpu.yaml", sets)
        assert {{c.key: c.value for c in plan.levers}}["train.compile"] is False
        args = ["run", "recipes/tiny_cpu.yaml", "--output-dir", {str(tmp_path / "run")!r}]
        for s in sets:
            args += ["--set", s]
        main(args)
        assert sys.modules["triton"] is None
        print("ok")
        """
    )
    assert out.strip().endswith("ok")
