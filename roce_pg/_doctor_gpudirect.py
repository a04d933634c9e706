"""The doctor's GPUDirect RDMA row (docs/ACCELERATORS.md): per GPU, the path a
group's device tensors take (dma-buf, peer memory, staged) and why, from what
the extension's choice (csrc/torch/device_memory.cpp) rests on: the driver's
dma-buf attribute, a peer-memory module in /proc/modules, the NIC provider's
answer to ibv_reg_dmabuf_mr, and rdma-core's version (>= 34 has it). No torch:
the driver and libibverbs are asked through ctypes, only on the real machine.
Device types roce learns of at run time (a PrivateUse1 backend's
roce_pg.declare_device_memory) are not known here."""
import ctypes
import errno
import os
from typing import List, Optional, Tuple

from . import _doctor_sysfs as sysfs
from ._doctor_rows import OK, WARN, Row

PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
_DMA_BUF_SUPPORTED = 124  # CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
_RDMA_WRITES_ORDERING = 118  # CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING
_ORDERING_OWNER = 100  # CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER
_NOT_SUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EPROTONOSUPPORT)


def peer_memory_module(root: sysfs.Root) -> Optional[str]:
    for line in (root.read("/proc/modules") or "").splitlines():
        if line.split(" ", 1)[0] in PEER_MEMORY_MODULES:
            return line.split(" ", 1)[0]
    return None


def nvidia_gpus(root: sysfs.Root) -> List[str]:
    """PCI addresses of NVIDIA GPUs (vendor 0x10de, display or 3D controller class)."""
    base = "/sys/bus/pci/devices"
    return [d for d in root.listdir(base) if root.read(f"{base}/{d}/vendor") == "0x10de"
            and (root.read(f"{base}/{d}/class") or "").startswith("0x03")]


def cuda_attributes(count: int) -> Tuple[List[Tuple[Optional[bool], Optional[int]]], str]:
    """Per CUDA device: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED and
    GPU_DIRECT_RDMA_WRITES_ORDERING (None where unknown), or Nones and why not."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return [(None, None)] * count, "libcuda.so.1 cannot be loaded (no NVIDIA driver)"
    if cuda.cuInit(0) != 0:
        return [(None, None)] * count, "cuInit failed"
    out = []
    for i in range(count):
        dev = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0:
            out.append((None, None))
            continue
        values = []
        for attr in (_DMA_BUF_SUPPORTED, _RDMA_WRITES_ORDERING):
            value = ctypes.c_int()
            values.append(value.value if cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0 else None)
        out.append((None if values[0] is None else bool(values[0]), values[1]))
    return out, ""


def flush_note(ordering: Optional[int]) -> str:
    """What the extension does with the NIC's writes into this GPU (cuda_driver.cpp)."""
    if ordering is None:
        return ""
    if ordering >= _ORDERING_OWNER:
        return "; NIC writes ordered by the GPU"
    return "; NIC writes flushed after each receive (GPU_DIRECT_RDMA_WRITES_ORDERING=NONE: before compute capability 9.0)"


def nic_dmabuf(device: str) -> Tuple[Optional[bool], str]:
    """The provider's answer for `device`: ibv_reg_dmabuf_mr with a memfd that is
    not a dma-buf (as the extension asks): EOPNOTSUPP = it has no dma-buf MRs."""
    try:
        lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    except OSError as e:
        return None, f"libibverbs.so.1 cannot be loaded ({e})"
    if not hasattr(lib, "ibv_reg_dmabuf_mr"):
        return False, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)"
    vp = ctypes.c_void_p
    lib.ibv_get_device_list.restype = ctypes.POINTER(vp)
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [vp]
    lib.ibv_open_device.restype = vp
    lib.ibv_open_device.argtypes = [vp]
    lib.ibv_close_device.argtypes = [vp]
    lib.ibv_alloc_pd.restype = vp
    lib.ibv_alloc_pd.argtypes = [vp]
    lib.ibv_dealloc_pd.argtypes = [vp]
    lib.ibv_dereg_mr.argtypes = [vp]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(vp)]
    lib.ibv_reg_dmabuf_mr.restype = vp
    lib.ibv_reg_dmabuf_mr.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
    n = ctypes.c_int(0)
    devs = lib.ibv_get_device_list(ctypes.byref(n))
    if not devs:
        return None, "no RDMA device list"
    try:
        match = [devs[i] for i in range(n.value) if lib.ibv_get_device_name(devs[i]).decode() == device]
        ctx = lib.ibv_open_device(match[0]) if match else None
        if not ctx:
            return None, f"cannot open {device}"
        try:
            pd = lib.ibv_alloc_pd(ctx)
            if not pd:
                return None, f"ibv_alloc_pd on {device} failed"
            fd = os.memfd_create("roce-doctor-dmabuf-probe")
            try:
                os.ftruncate(fd, 4096)
                ctypes.set_errno(0)
                mr = lib.ibv_reg_dmabuf_mr(pd, 0, 4096, 0, fd, 1)  # IBV_ACCESS_LOCAL_WRITE
                e = ctypes.get_errno()
                if mr:
                    lib.ibv_dereg_mr(mr)
            finally:
                os.close(fd)
                lib.ibv_dealloc_pd(pd)
        finally:
            lib.ibv_close_device(ctx)
    finally:
        lib.ibv_free_device_list(devs)
    if mr or e not in _NOT_SUPPORTED:
        return True, f"{device} registers dma-bufs"
    return False, f"{device} refuses ibv_reg_dmabuf_mr ({os.strerror(e)}): its provider has no dma-buf MRs"


def gpu_path(dmabuf: Optional[bool], nic: Optional[bool], peermem: Optional[str]) -> str:
    """The extension's order: dma-buf first, peer memory second, staged last."""
    if dmabuf and nic:
        return "dma-buf"
    return "peer memory" if peermem else "staged"


def check_gpudirect(m, nic_device: Optional[str]) -> Row:
    """One row: every GPU's path, or what a GPU would get on this machine."""
    root = m.root
    peermem = peer_memory_module(root)
    version = sysfs.rdma_core_version(sysfs.libibverbs(root))
    nic, nic_why = (nic_dmabuf(nic_device) if nic_device and root.is_real and m.verbs is not None
                    else (None, "NIC not asked" if nic_device else "no RDMA port"))
    facts = [f"NIC: {nic_why}", f"rdma-core {version or '?'}",
             f"peer memory: {peermem + ' loaded' if peermem else 'no nvidia_peermem in /proc/modules'}"]
    if m.get("ROCE_PG_GPUDIRECT") == "off":
        return Row("GPUDirect RDMA", OK, "ROCE_PG_GPUDIRECT=off: device tensors are staged; " + "; ".join(facts))
    gpus = nvidia_gpus(root)
    if not gpus:
        return Row("GPUDirect RDMA", OK, "no NVIDIA GPU: CUDA tensors would be staged; " + "; ".join(facts))
    if not nic_device:
        return Row("GPUDirect RDMA", OK, f"{len(gpus)} NVIDIA GPU(s) but no RDMA port: device tensors are staged "
                                         "(only verbs takes device memory); " + "; ".join(facts))
    attrs, why = cuda_attributes(len(gpus)) if root.is_real else ([(None, None)] * len(gpus), "driver not asked")
    paths = []
    for i, (pci, (attr, ordering)) in enumerate(zip(gpus, attrs)):
        driver = why or ("driver exports dma-bufs" if attr else "driver: DMA_BUF_SUPPORTED=0")
        path = gpu_path(attr, nic, peermem)
        flush = flush_note(ordering) if path != "staged" else ""
        paths.append((path, f"cuda:{i} ({pci}): {path} [{driver}{flush}]"))
    detail = "; ".join(p[1] for p in paths) + "; " + "; ".join(facts)
    if any(p[0] == "staged" for p in paths):
        return Row("GPUDirect RDMA", WARN, detail + ": device tensors are staged through host memory",
                   "modprobe nvidia-peermem (peer memory), or use an NVIDIA driver and NIC whose provider "
                   "registers dma-bufs (open kernel modules, CUDA >= 11.7, rdma-core >= 34)")
    return Row("GPUDirect RDMA", OK, detail)
