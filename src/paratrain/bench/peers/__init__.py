"""Reference ("peer") programs for ``paratrain bench``: the same training that paratrain runs,
written independently in other styles (plain PyTorch DDP as seed 000 shows it, HF Accelerate,
Lightning Fabric) plus a speed-of-light row (``sol``: one device, one synthetic batch kept on the
device). Each is a module run as ``python -m paratrain.bench.peers.<name> CONFIG_YAML OUT_DIR``
(the distributed ones under torchrun) that reads a paratrain run config and writes
``OUT_DIR/result.json``; they share only small helpers (common.py), never paratrain's own loop,
samplers, device loader, transforms or model builders, so a difference in speed points at the
data path or the loop rather than at shared code. Exit codes: 0 done, 2 config not supported
(one line on stderr), 3 an optional library is missing (``skipped: <library> is not installed``).
"""
