"""`paratrain export`: one checkpoint, of any layout, consolidated into one model a user can load
without paratrain (consolidate.py)."""
