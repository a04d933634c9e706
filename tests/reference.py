"""Inputs and independently computed results for the collective matrix.

Every rank can regenerate every other rank's input from a seed, so each rank
computes the expected result on its own: in float64 / complex128 for floating
types (compared with a tolerance that fits the dtype), exactly in int64 for
integers (wrapped back to the dtype, as two's-complement arithmetic does) and
with logical operators for bool.
"""
import functools
import zlib

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
DTYPES = FLOATS + INTS + [torch.bool] + COMPLEX
import os

# ROCE_TEST_LARGE_SIZE replaces the largest size (the Soft-RoCE VM runs under
# full CPU emulation, where 1 MiB-element cases across the matrix take too long).
SIZES = [0, 1, 7, 1000, int(os.environ.get("ROCE_TEST_LARGE_SIZE", (1 << 20) + 3))]

# Absolute/relative tolerance per floating dtype: sums of at most four inputs of
# magnitude <= 2 (products <= 1.5^4), rounded once per ring hop at worst.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12),
    torch.float16: (2e-2, 1e-2),
    torch.bfloat16: (1e-1, 2e-2),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-12, 1e-12),
}

OP_NAMES = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "PREMUL_SUM_TENSOR"]


def applicable_ops(dtype):
    if dtype == torch.bool:
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dtype.is_complex:
        # torch rejects other ops on complex tensors before calling any backend
        return ["SUM", "AVG", "PREMUL_SUM"]
    if dtype.is_floating_point:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "PREMUL_SUM_TENSOR"]
    return OP_NAMES


def premul_factor(opname, dtype):
    # Powers of two (floats) and small integers (ints) keep the scaling exact.
    if dtype.is_floating_point or dtype.is_complex:
        return 2.0 if opname == "PREMUL_SUM" else 0.5
    return 2.0 if opname == "PREMUL_SUM" else 3.0


def make_op(opname, dtype, device="cpu"):
    """The ReduceOp; PREMUL_SUM_TENSOR's factor lives on `device`, as a
    factor computed there would."""
    if opname == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(premul_factor(opname, dtype))
    if opname == "PREMUL_SUM_TENSOR":
        return dist._make_nccl_premul_sum(
            torch.tensor([premul_factor(opname, dtype)], dtype=torch.float64, device=device))
    return getattr(ReduceOp, opname)


def _value_class(opname):
    if opname == "PRODUCT":
        return "product"
    if opname in ("BAND", "BOR", "BXOR", "MIN", "MAX"):
        return "wide"
    return "sum"


@functools.lru_cache(maxsize=256)
def make_input(rank, numel, dtype, value_class, salt=0):
    """Rank `rank`'s input; identical on every process that asks for it."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{rank}/{numel}/{dtype}/{value_class}/{salt}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        real = torch.float64
        lo, hi = (0.5, 1.5) if value_class == "product" else (-2.0, 2.0)
        def draw():
            return torch.rand(numel, generator=g, dtype=real) * (hi - lo) + lo
        if dtype.is_complex:
            return torch.complex(draw(), draw()).to(dtype)
        return draw().to(dtype)
    info = torch.iinfo(dtype)
    if value_class == "product":
        lo, hi = (0, 4) if info.min == 0 else (-3, 4)
    elif value_class == "wide":
        lo, hi = info.min, info.max
    else:
        lo, hi = (0, 41) if info.min == 0 else (-20, 21)
    return torch.randint(max(lo, -(2**62)), min(hi, 2**62), (numel,), generator=g, dtype=torch.int64).to(dtype)


def inputs_for(world, numel, dtype, opname, salt=0):
    return [make_input(r, numel, dtype, _value_class(opname), salt) for r in range(world)]


def block_input(rank, block, numel, dtype, opname, salt=0):
    """Block `block` of a rank's blocked input (reduce_scatter): generated per
    block, so a rank can regenerate just the block it needs from every peer."""
    return make_input(rank, numel, dtype, _value_class(opname), salt * 1000 + 100 + block)


def reduce_reference(xs, opname, dtype):
    """The reduction of the list xs, computed independently of the backend."""
    n = len(xs)
    if dtype == torch.bool:
        ys = [x.to(torch.int64) for x in xs]
        stack = torch.stack(ys)
        if opname in ("SUM", "MAX", "BOR"):
            r = stack.amax(0) if stack.numel() else stack.sum(0)
        elif opname in ("PRODUCT", "MIN", "BAND"):
            r = stack.amin(0) if stack.numel() else stack.sum(0)
        else:  # BXOR
            r = stack.sum(0) % 2
        return r.bool()
    exact = not (dtype.is_floating_point or dtype.is_complex)
    wide = torch.int64 if exact else (torch.complex128 if dtype.is_complex else torch.float64)
    ys = [x.to(wide) for x in xs]
    if opname in ("PREMUL_SUM", "PREMUL_SUM_TENSOR"):
        f = premul_factor(opname, dtype)
        ys = [(y * int(f)) if exact else (y * f) for y in ys]
    if opname in ("SUM", "AVG", "PREMUL_SUM", "PREMUL_SUM_TENSOR"):
        r = functools.reduce(torch.add, ys)
        if opname == "AVG":
            if exact:  # wrapped sum, then division truncating toward zero
                r = torch.div(r.to(dtype).to(torch.int64), n, rounding_mode="trunc")
            else:
                r = r / n
    elif opname == "PRODUCT":
        r = functools.reduce(torch.mul, ys)
    elif opname == "MIN":
        r = functools.reduce(torch.minimum, ys)
    elif opname == "MAX":
        r = functools.reduce(torch.maximum, ys)
    elif opname == "BAND":
        r = functools.reduce(torch.bitwise_and, ys)
    elif opname == "BOR":
        r = functools.reduce(torch.bitwise_or, ys)
    else:
        r = functools.reduce(torch.bitwise_xor, ys)
    return r.to(dtype) if exact else r


class Checker:
    """Collects mismatches instead of stopping at the first, and counts checks."""

    def __init__(self, rank):
        self.rank = rank
        self.checks = 0
        self.failures = []

    def close(self, what, got, expected, dtype):
        self.checks += 1
        got, expected = got.cpu(), expected.cpu()  # device results (tests/test_accelerator.py) compare on the host
        try:
            if dtype.is_floating_point or dtype.is_complex:
                atol, rtol = TOLERANCE[dtype]
                wide = torch.complex128 if dtype.is_complex else torch.float64
                assert got.shape == expected.shape, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
                g, e = got.to(wide), expected.to(wide)
                # |got - expected| <= atol + rtol |expected|, cheaply; assert_close only to describe a failure
                if not bool(((g - e).abs() <= e.abs() * rtol + atol).all()):
                    torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
                    raise AssertionError("values differ (NaN?)")
            else:
                assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
                if not torch.equal(got, expected):
                    if got.shape != expected.shape:
                        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(expected.shape)}")
                    flat_got, flat_expected = got.reshape(-1), expected.reshape(-1)  # 0-dim tensors too
                    bad = (flat_got != flat_expected).nonzero()
                    i = int(bad[0][0])
                    raise AssertionError(f"{len(bad)} elements differ, first at flat index {i}: "
                                         f"got {flat_got[i]} expected {flat_expected[i]}")
        except AssertionError as e:
            if len(self.failures) < 50:
                self.failures.append(f"rank {self.rank}: {what}: {str(e)[:400]}")
            else:
                self.failures.append("...")

    def true(self, what, ok):
        """A condition that is not a comparison of values."""
        self.checks += 1
        if not ok and len(self.failures) <= 50:
            self.failures.append(f"rank {self.rank}: {what}: not so")

    def same(self, what, got, expected):
        self.close(what, got, expected, got.dtype)

    def result(self):
        return {"checks": self.checks, "failures": self.failures}
