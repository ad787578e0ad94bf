"""What a run measures of itself: step metrics, samples/s and memory (metrics.py), power and
energy from NVML (telemetry.py), torch.profiler traces (profiling.py) and the host's waits for
the GPU during profiled steps (syncs.py). Measures only: nothing here changes a step."""
