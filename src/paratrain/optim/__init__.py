"""Optimizers paratrain adds beside torch's and torchao's: AdamW holding the fp32 master weights
of a model whose own weights are bf16 (train.bf16_weights)."""
