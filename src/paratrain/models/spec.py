"""ModelSpec: what the parallel layer may know about a model family, and nothing more.

parallel/ applies tensor parallelism, activation checkpointing, compilation, FSDP / DDP, pipeline
cuts and layer splits from outside the model. It never names a model class: it asks the spec of
the model's family for

- blocks(model): the repeated units (decoder layers, trunk blocks): FSDP's units, what activation
  checkpointing recomputes, what regional compilation compiles one by one;
- pipeline_units(model) and make_stage(model, keep, stage, stages): the model as a chain of units
  in forward order, and this rank's stage of it (the other units replaced by parameterless
  nn.Identity so parameter names stay the whole model's); make_stages(model, local, stages):
  several stages on one rank for an interleaved schedule, each a module sharing the model's
  units (or a one-line refusal where the family has none);
- split_units(model): the chain again, for the one-process layer split;
- tp_plan(model, ...): {module path: ParallelStyle} for torch.distributed.tensor.parallel, or a
  one-line refusal for families that have none;
- flops_per_token(model, seq_len, trainable): training FLOPs for MFU (None where it is not
  counted).

One spec per family: models/vision.py (torchvision classifiers, the tiny CNN, a user's builder)
and models/causal_lm/spec.py (Hugging Face causal LMs of the Llama layout).
"""

from __future__ import annotations
