"""Parallelism, applied from outside the model (apply.py): tensor parallel, activation
checkpointing, compile, FSDP2 / DDP / DataParallel, in one fixed order; pipeline stages
(pipeline.py) and the one-process layer split (split.py); how DDP's replicas agree (sync.py).

Nothing here reads a strategy name or names a model class: runplan/strategies.py turns a
strategy into degrees and a wrapper, and each model family's spec (models/*/spec.py) answers
what its blocks are and how its layers split.
"""
