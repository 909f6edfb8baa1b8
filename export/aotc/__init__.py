"""aotc: export a PyTorch model file to a verified AOTInductor package, and serve it.

Importing this package is cheap: torch is imported lazily by the stages that need it.
"""

__version__ = "0.1.0"
