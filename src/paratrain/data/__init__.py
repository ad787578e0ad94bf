"""Data: sources (MNIST IDX files, an embedded real MNIST sample, ImageFolder, synthetic),
samplers (full / round-robin / distributed), loaders and the host-to-device path."""
