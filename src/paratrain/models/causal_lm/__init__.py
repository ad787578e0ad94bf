"""Causal language models through Hugging Face transformers: build (a checkpoint or a named Llama
shape), LoRA (peft), fused kernels and float8 layers, the loss wrapper, and CausalLMSpec, what
parallel/ may know of them."""
