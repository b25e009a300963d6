"""The package version: a leaf module, so that any layer can name it without importing the
whole public surface (tableq/__init__.py)."""

__version__ = "0.1.0"
