"""Recipes that ship with the package: `paratrain demo`'s (demo_cpu.yaml, demo_gpu.yaml)."""
