"""The analytic forecast: a decoder's step on a hardware profile (hardware.py) priced from its
shape and layout alone (step.py), the best layout searched (search.py), checked against
published tables (validate.py), and `paratrain plan --hardware` (offline.py)."""
