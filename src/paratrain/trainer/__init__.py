"""The training loop and what it owns: setup.py (build everything), step.py (one optimizer step),
measure.py (clocks, warm-up, schedules), result.py (summary, result.json), checkpoint.py (DCP),
config.py (TrainConfig, LogConfig); loop.py's `train(cfg)` runs them in order."""
