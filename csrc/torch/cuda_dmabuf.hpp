// CUDA memory as a dma-buf for ibv_reg_dmabuf_mr, through the CUDA driver API
// loaded at run time (dlopen("libcuda.so.1")): no CUDA header or library at
// build time, and a machine without a driver simply answers "unsupported".
// Not exercised without a GPU (docs/ACCELERATORS.md says what was verified).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace roce {

// Whether CUDA device `index` can export dma-bufs: the driver loads, and
// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is set. `why` says what decided.
bool cudaDmabufSupported(int index, std::string* why);

// A dma-buf fd (the caller closes it) for the allocation holding
// [ptr, ptr + len) on CUDA device `index`, and ptr's offset within it; -1 on
// failure. The allocation's base, from cuMemGetAddressRange: the caching
// allocator packs tensors into larger blocks, and the driver exports whole
// page-aligned ranges.
int exportCudaDmabuf(const void* ptr, size_t len, int index, uint64_t* offset);

}  // namespace roce
