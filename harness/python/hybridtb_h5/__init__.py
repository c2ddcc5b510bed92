"""hybridtb_h5: read and write hybrid-batch HDF5 files (datasets/SCHEMA.md) with h5py + numpy.

    from hybridtb_h5 import open_batch, check, write_hybrid_batch

`reader` opens files lazily (open_batch: tensors decoded only where indexed) and checks them
(check, in bounded memory); `writer` writes every item the C++ reader accepts
(write_hybrid_batch, write_tensor) and makes example batches. Import it with
`PYTHONPATH=<repo>/harness/python`, or install it with `pip install <repo>/harness/python`.
Only h5py and numpy are needed (Debian: python3-h5py).
"""
from .reader import BatchFile, LazyTensor, check, describe, open_batch
from .writer import (example_batch, example_linear_layer, example_ssm, write_hybrid_batch, write_tensor,
                     to_bfloat16_bits)

__all__ = ["BatchFile", "LazyTensor", "check", "describe", "open_batch", "example_batch", "example_linear_layer",
           "example_ssm", "write_hybrid_batch", "write_tensor", "to_bfloat16_bits"]
