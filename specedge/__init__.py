"""specedge: exact speculative decoding on one local machine."""

__version__ = "0.1.0"
