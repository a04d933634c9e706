#include "dmabuf.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace roce::transport::verbs {

RegDmabufMr regDmabufMr() {
  // The extension links libibverbs, which is loaded by now; RTLD_NOLOAD takes
  // that copy (its symbols are not global: Python loads extensions locally).
  static const RegDmabufMr fn = [] {
    void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<RegDmabufMr>(dlsym(lib, "ibv_reg_dmabuf_mr")) : nullptr;
  }();
  return fn;
}

DmabufAnswer probeDmabuf(ibv_pd* pd, const std::string& device) {
  RegDmabufMr reg = regDmabufMr();
  if (!reg) return {false, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)"};
  const int fd = memfd_create("roce-dmabuf-probe", MFD_CLOEXEC);
  if (fd < 0) return {false, std::string("memfd_create failed: ") + std::strerror(errno)};
  if (ftruncate(fd, 4096) != 0) {
    const int e = errno;
    ::close(fd);
    return {false, std::string("ftruncate of the probe memfd failed: ") + std::strerror(e)};
  }
  errno = 0;
  ibv_mr* mr = reg(pd, 0, 4096, 0, fd, IBV_ACCESS_LOCAL_WRITE);
  const int e = errno;
  if (mr) ibv_dereg_mr(mr);  // a provider that took a memfd: it registers dma-bufs at least
  ::close(fd);
  if (mr || (e != EOPNOTSUPP && e != ENOSYS && e != EPROTONOSUPPORT))
    return {true, device + " registers dma-bufs (ibv_reg_dmabuf_mr: " + (mr ? "took a probe" : std::strerror(e)) +
                      " for a non-dma-buf fd)"};
  return {false, device + " refuses ibv_reg_dmabuf_mr (" + std::strerror(e) + "): its provider has no dma-buf MRs"};
}

DmabufAnswer probeDmabufFirstDevice() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    return {false, "no RDMA device"};
  }
  DmabufAnswer a{false, std::string("cannot open ") + ibv_get_device_name(list[0])};
  if (ibv_context* ctx = ibv_open_device(list[0])) {
    if (ibv_pd* pd = ibv_alloc_pd(ctx)) {
      a = probeDmabuf(pd, ibv_get_device_name(list[0]));
      ibv_dealloc_pd(pd);
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return a;
}

}  // namespace roce::transport::verbs
