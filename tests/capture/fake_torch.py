"""A numpy-backed stand-in for the few torch features the capture hook and the fake engine use.

Used by the capture tests only when real torch is absent (CI has no torch); with torch installed
the same tests run on real tensors (CUDA when available). It models what matters for capture:
dtypes by name (`str(t.dtype) == "torch.bfloat16"`), bf16 and fp8 as raw bits that `.numpy()`
refuses (as torch does) until `.view(torch.int16 / torch.uint8)`, byte-reinterpreting `.view`,
`index_select`, slicing views, `copy_`, and `torch.cuda.is_current_stream_capturing()`.
Anything else raises AttributeError, so a hook that starts using more of torch fails loudly here.
"""
import numpy as np

__version__ = "0.0-fake"
IS_FAKE = True


class dtype:
    def __init__(self, name, storage, is_floating_point):
        self.name, self.storage, self.is_floating_point = name, np.dtype(storage), is_floating_point
        self.itemsize = self.storage.itemsize

    def __repr__(self):
        return f"torch.{self.name}"

    __str__ = __repr__


bfloat16 = dtype("bfloat16", "<u2", True)
float16 = dtype("float16", "<f2", True)
half = float16
float32 = dtype("float32", "<f4", True)
float64 = dtype("float64", "<f8", True)
float8_e4m3fn = dtype("float8_e4m3fn", "u1", True)
float8_e5m2 = dtype("float8_e5m2", "u1", True)
uint8 = dtype("uint8", "u1", False)
int8 = dtype("int8", "i1", False)
int16 = dtype("int16", "<i2", False)
int32 = dtype("int32", "<i4", False)
int64 = dtype("int64", "<i8", False)
bool = dtype("bool", "?", False)  # noqa: A001  (torch's name)

_BY_NUMPY = {np.dtype("<f2"): float16, np.dtype("<f4"): float32, np.dtype("<f8"): float64, np.dtype("u1"): uint8,
             np.dtype("i1"): int8, np.dtype("<i2"): int16, np.dtype("<i4"): int32, np.dtype("<i8"): int64,
             np.dtype("?"): bool}
_OPAQUE = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # numpy has no such type: torch refuses .numpy()


class device:
    def __init__(self, name="cpu"):
        self.type = str(name)

    def __str__(self):
        return self.type

    __repr__ = __str__


_CPU = device("cpu")


class Tensor:
    def __init__(self, array, dt=None):
        self._a = array
        self._dtype = dt or _BY_NUMPY[array.dtype]
        if self._a.dtype != self._dtype.storage:
            raise TypeError(f"storage {self._a.dtype} does not hold {self._dtype}")

    # -- what the hook reads
    @property
    def dtype(self):
        return self._dtype

    @property
    def shape(self):
        return tuple(self._a.shape)

    @property
    def device(self):
        return _CPU

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return self._a.ndim

    def numel(self):
        return int(self._a.size)

    def element_size(self):
        return self._dtype.itemsize

    def detach(self):
        return self

    def cpu(self):
        return self

    def to(self, *args, **kwargs):
        return self

    def contiguous(self):
        return Tensor(np.ascontiguousarray(self._a), self._dtype)

    def numpy(self):
        if self._dtype.name in _OPAQUE:
            raise TypeError(f"Got unsupported ScalarType {self._dtype.name}")
        return self._a

    def view(self, *args):
        if len(args) == 1 and isinstance(args[0], dtype):
            target = args[0]
            if target.itemsize != self._dtype.itemsize:
                raise RuntimeError("fake torch: view between dtypes of different sizes is not modelled")
            return Tensor(self._a.view(target.storage), target)
        shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        return Tensor(self._a.reshape(shape), self._dtype)

    reshape = view

    def index_select(self, dim, index):
        idx = index._a if isinstance(index, Tensor) else np.asarray(index)
        return Tensor(np.take(self._a, idx.astype(np.int64), axis=dim), self._dtype)

    def __getitem__(self, key):
        return Tensor(self._a[key], self._dtype)

    def unbind(self, dim=0):
        return tuple(Tensor(np.take(self._a, i, axis=dim), self._dtype) for i in range(self._a.shape[dim]))

    def transpose(self, a, b):
        return Tensor(np.swapaxes(self._a, a, b), self._dtype)

    def copy_(self, src, non_blocking=False):
        if src._dtype is not self._dtype:
            raise TypeError(f"fake torch: copy_ from {src._dtype} to {self._dtype} is not modelled")
        self._a[...] = src._a
        return self

    def fill_(self, value):
        if self._dtype.name in _OPAQUE:
            raise TypeError("fake torch: fill_ of bf16/fp8 is not modelled")
        self._a[...] = value
        return self

    def item(self):
        return self.numpy().reshape(-1)[0].item()

    def tolist(self):
        return self.numpy().tolist()

    def __len__(self):
        return self._a.shape[0]

    def __repr__(self):
        return f"fake_torch.Tensor({self._dtype}, shape={list(self.shape)})"


def from_numpy(array):
    return Tensor(array)


def as_tensor(data, dtype=None, device=None):
    a = np.asarray(data)
    t = Tensor(a) if a.dtype in _BY_NUMPY else Tensor(a.astype(np.int64))
    return t if dtype is None else Tensor(a.astype(dtype.storage), dtype)


def tensor(data, dtype=None, device=None):
    return as_tensor(np.array(data), dtype, device)


def zeros(*shape, dtype=float32, device=None):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return Tensor(np.zeros(shape, dtype.storage), dtype)


class _Cuda:
    """torch.cuda without a GPU; tests flip `_capturing` to model a CUDA-graph capture."""
    _capturing = False

    def is_available(self):
        return False

    def is_current_stream_capturing(self):
        return self._capturing


cuda = _Cuda()


class _Version:
    cuda = None


version = _Version()


class _Distributed:
    def is_available(self):
        return False

    def is_initialized(self):
        return False


distributed = _Distributed()
