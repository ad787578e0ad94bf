"""`paratrain comm`: the collectives timed over message sizes (collectives.py) and the worker
each torchrun process runs (worker.py, `python -m paratrain.comm.worker CONFIG_JSON`)."""
