"""`paratrain tune RECIPE`: search the levers for the fastest set-up of this recipe on this
machine. space.py: the levers; search.py: coordinate descent over short trials,
stored in the results DB (resumable), the memory pruning and the numerics guard; output.py:
the ranked table, tune.json and the winning recipe with each lever commented."""
