// Registering dma-bufs with the NIC (GPUDirect RDMA's first path,
// docs/ACCELERATORS.md): ibv_reg_dmabuf_mr exists from rdma-core 34 on, so it
// is looked up at run time (dlsym) and roce builds and loads with older
// rdma-core too; whether the provider implements it is a question only the
// provider can answer.
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace roce::transport::verbs {

using RegDmabufMr = ibv_mr* (*)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);

// libibverbs' ibv_reg_dmabuf_mr, or null (rdma-core < 34).
RegDmabufMr regDmabufMr();

struct DmabufAnswer {
  bool supported = false;
  std::string why;  // the rdma-core symbol, the provider's errno
};

// Asks the provider behind `pd` with a memfd that is not a dma-buf: a provider
// (or kernel) without dma-buf MRs answers EOPNOTSUPP/ENOSYS before looking at
// the fd; one with them refuses the fd itself (EINVAL, EBADF...). Nothing is
// registered either way. `device` names it in the answer.
DmabufAnswer probeDmabuf(ibv_pd* pd, const std::string& device);

// The same for the first verbs device libibverbs lists (the doctor and tests
// ask without a group); `why` says so when there is none.
DmabufAnswer probeDmabufFirstDevice();

}  // namespace roce::transport::verbs
