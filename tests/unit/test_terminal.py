"""launch/terminal.py: a write to a terminal that hung up fails with EIO; a guarded stream
sends the process's output to /dev/null instead of raising. Run in a child process: the guard
points the process's own file descriptors 1 and 2 elsewhere."""

import subprocess
import sys

CHILD = r"""
import io, os, sys
from paratrain.launch import terminal
master, slave = os.openpty()
os.dup2(slave, 1)
os.dup2(slave, 2)
sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", 0, closefd=False), write_through=True)
guard = sys.argv[1] == "guarded"
if guard:
    terminal.outlive_hangup()
print("before", flush=True)
os.read(master, 100)
os.close(master)  # the terminal hangs up
try:
    print("after", flush=True)
    said = "wrote"
except OSError as e:
    said = f"raised {e.errno}"
with open(sys.argv[2], "w") as f:
    f.write(said + " " + os.readlink("/proc/self/fd/1"))
"""


def test_a_guarded_stream_outlives_its_terminal(tmp_path):
    for how, expect in (("guarded", "wrote /dev/null"), ("plain", "raised 5 /dev/pts/")):
        said = tmp_path / how
        subprocess.run([sys.executable, "-c", CHILD, how, str(said)], timeout=60, check=True)
        assert said.read_text().startswith(expect), (how, said.read_text())
