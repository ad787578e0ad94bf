"""paratrain: train PyTorch models on one GPU, many GPUs and many nodes, and measure which way is
fastest for your model."""

__version__ = "0.1.0"
