"""dynamo: a trace JIT for PyTorch programs. This package is the Python side of libdynamo.

Today it exposes the native engine (dynamo.native): parse a trace, compile it into a frame,
run it on torch tensors. The recording front end (dynamo.optimize) is issue 4.
"""
from ._capi import DynamoError, ABI_VERSION  # noqa: F401
from . import native  # noqa: F401

__version__ = "0.1.0"
