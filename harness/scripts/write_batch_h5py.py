#!/usr/bin/env python3
"""Command-line entry and compatibility module for hybridtb_h5.writer (harness/python/hybridtb_h5).

Run from a checkout, it finds the package next to it; `import write_batch_h5py` keeps working for
code written against the old single-file script and gives the same names as hybridtb_h5.writer.

    python3 harness/scripts/write_batch_h5py.py --help
"""
import os
import sys

try:
    import hybridtb_h5  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a checkout: harness/python next to this script's directory
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
from hybridtb_h5.writer import *  # noqa: E402,F401,F403  (the module's public names)
from hybridtb_h5.writer import main  # noqa: E402

if __name__ == "__main__":
    main()
