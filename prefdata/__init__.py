"""prefdata: trustworthy preference (DPO) training data."""

__version__ = "0.1.0"
FORMAT_VERSION = 1
