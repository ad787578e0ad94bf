"""Who the ranks are and how they are arranged: the process group (process_group.py) and the one
DeviceMesh that names the parallel axes (parallel_dims.py)."""
