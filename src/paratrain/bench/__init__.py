"""paratrain bench: sweeps that compare paratrain's training loop with reference programs."""
