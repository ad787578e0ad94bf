"""paratrain's version, in a module of its own: result.json records it without importing the
package root (whose paratrain.train reaches api.py, and from there the whole run)."""

__version__ = "0.1.0"
