"""Builds roce_pg._C, the C++ core of the roce process-group backend.

Only csrc/torch/ includes torch headers; everything else is plain C++20 and
compiles in seconds. libibverbs (rdma-core) is linked already: the module
imports fine on machines with rdma-core installed but no RDMA device.
"""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))

setup(
    name="roce_pg",
    version="0.1.0",
    description="PyTorch distributed backend over RDMA verbs (RoCE/InfiniBand), shared memory and TCP",
    packages=["roce_pg"],
    ext_modules=[
        CppExtension(
            name="roce_pg._C",
            sources=sources,
            # torch.utils.cpp_extension picks the C++ standard torch needs (C++20
            # for torch >= 2.15); do not pass -std here.
            extra_compile_args={"cxx": ["-O3", "-Wall", "-fno-strict-aliasing"]},
            libraries=["ibverbs", "rt"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={
        # torch >= 2.15 loads this when init_process_group("roce") names the backend
        # without `import roce_pg`.
        "torch.distributed.backends": ["roce = roce_pg:register"],
    },
    python_requires=">=3.9",
)
