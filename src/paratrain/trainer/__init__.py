"""The training loop and what it owns. loop.py: `train(plan)`, the process group around a
Trainer. trainer.py: the Trainer, its components wired with the fields each reads, the loop.
setup.py: everything built once (the task's workload, parallelize's decisions, optimizers) into
built.py's Built and Schedule. step.py: one optimizer step from a Step record. checkpointer.py,
evaluate.py, guard.py, interrupts.py, watchdog.py, measure.py, report.py, steplog.py, losses.py,
result.py: the loop's components. precision.py (dtype, autocast, GradScaler) and faults.py
(injected faults for the tests) serve the loop alone; config.py builds the optimizer a
TrainConfig names (the settings themselves are config/train.py's)."""
