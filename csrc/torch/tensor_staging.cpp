#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "tensor_staging.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <cstdint>

#include "../common/error.hpp"

namespace roce::adapter {
namespace {

// Concatenates CPU tensors (any layout) into one contiguous host buffer.
at::Tensor flatHost(const std::vector<at::Tensor>& ts) {
  at::NoGradGuard noGrad;
  std::vector<at::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat).contiguous();
}

// Output tensors that receive consecutive slices of one host buffer.
std::vector<Staged> slicesOf(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  std::vector<Staged> v;
  int64_t at = 0;
  for (const auto& o : outs) {
    v.push_back({o, flat.narrow(0, at, o.numel()), true});
    at += o.numel();
  }
  return v;
}

int64_t totalNumel(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

}  // namespace

void Staged::finish() const {
  if (!copyBack) return;
  at::NoGradGuard noGrad;
  user.copy_(host.view(user.sizes()));
}

Staged stage(const at::Tensor& t, bool readable) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu(), "roce: stage() is for CPU tensors; device tensors go through DeviceStaging");
  at::NoGradGuard noGrad;
  Staged s;
  s.user = t;
  if (t.device().is_cpu() && t.is_contiguous()) {
    s.host = t;
    return s;
  }
  s.copyBack = true;
  if (readable) s.host = t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  else s.host = at::empty(t.sizes(), t.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
  return s;
}

at::Tensor CallStaging::directly(const at::Tensor& t, bool read, bool write) {
  if (t.is_contiguous() && t.storage().nbytes() <= directLimit) {
    device->addDirect(t);
    return t.view(-1);
  }
  at::Tensor flat = device->deviceBuffer(t.numel(), t.scalar_type());
  device->add(t, flat.view(t.sizes()), read, write);
  return flat;
}

void CallStaging::flushReceived() const {
  if (!direct || !flushNicWrites) return;
  const c10::Device d = device->device();
  const int index = d.has_index() ? d.index() : 0;
  if (!flushNicWrites(index))
    throwComm(str("flushing the NIC's writes into ", d.str(), " failed (cuFlushGPUDirectRDMAWrites); "
                  "received data may not be visible to its kernels: set ROCE_PG_GPUDIRECT=off on every rank"));
}

at::Tensor CallStaging::input(const at::Tensor& t) {
  if (!device) return stage(t, true).host;
  if (direct) return directly(t, /*read=*/true, /*write=*/false);
  at::Tensor host = device->hostBuffer(t.numel(), t.scalar_type());
  device->add(t, host.view(t.sizes()), /*read=*/true, /*write=*/false);
  return host;
}

at::Tensor CallStaging::output(const at::Tensor& t) {
  if (!device) {
    cpuOutputs.push_back(stage(t, false));
    return cpuOutputs.back().host;
  }
  if (direct) return directly(t, /*read=*/false, /*write=*/true);
  at::Tensor host = device->hostBuffer(t.numel(), t.scalar_type());
  device->add(t, host.view(t.sizes()), /*read=*/false, /*write=*/true);
  return host;
}

at::Tensor CallStaging::rows(const at::Tensor& t, int64_t rows, bool read, bool write) {
  if (!device || direct) return write ? output(t) : input(t);
  at::Tensor host = device->hostBuffer(t.numel(), t.scalar_type());
  device->add(t, host, read, write, /*offset=*/0, rows);
  return host;
}

at::Tensor CallStaging::inputs(const std::vector<at::Tensor>& ts) {
  TORCH_INTERNAL_ASSERT(!ts.empty());
  return device ? inPlace(ts, true, false) : flatHost(ts);
}

at::Tensor CallStaging::outputs(const std::vector<at::Tensor>& ts) {
  if (!device) {
    TORCH_INTERNAL_ASSERT(!ts.empty());
    at::Tensor flat = at::empty({totalNumel(ts)}, ts[0].options().device(at::kCPU));
    for (auto& s : slicesOf(flat, ts)) cpuOutputs.push_back(s);
    return flat;
  }
  return inPlace(ts, false, true);
}

at::Tensor CallStaging::inPlace(const std::vector<at::Tensor>& ts, bool read, bool write) {
  TORCH_INTERNAL_ASSERT(!ts.empty());
  if (!device) {
    if (ts.size() == 1) {
      Staged s = stage(ts[0], read);
      s.copyBack = s.copyBack && write;
      cpuOutputs.push_back(s);
      return s.host;
    }
    at::Tensor flat = flatHost(ts);
    if (write)
      for (auto& s : slicesOf(flat, ts)) cpuOutputs.push_back(s);
    return flat;
  }
  if (direct && ts.size() == 1) return directly(ts[0], read, write);
  // Several tensors in one buffer: pinned host memory when staged; with
  // GPUDirect a device buffer, filled and drained by device-to-device
  // copies, which the transport gets as it is.
  const int64_t numel = totalNumel(ts);
  at::Tensor flat = direct ? device->deviceBuffer(numel, ts[0].scalar_type())
                           : device->hostBuffer(numel, ts[0].scalar_type());
  int64_t at = 0;
  for (const auto& t : ts) {
    device->add(t, flat.narrow(0, at, t.numel()).view(t.sizes()), read, write, at);
    at += t.numel();
  }
  return flat;
}

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "roce: ", op, ": got an undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "roce: ", op, ": ", t.layout(),
              " tensors are not supported (only dense strided tensors); convert with .to_dense()");
  // Device tensors are staged through the device-generic stream API, which
  // any device with a registered DeviceGuardImpl provides; meta tensors have
  // no data to send.
  const c10::DeviceType type = t.device().type();
  TORCH_CHECK(type == c10::DeviceType::CPU || (type != c10::DeviceType::Meta && c10::impl::hasDeviceGuardImpl(type)),
              "roce: ", op, ": tensors on ", t.device(),
              " are not supported (CPU tensors, or tensors of a device with streams: CUDA, ROCm, a PrivateUse1 device)");
}

void checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "roce: ", op, " takes exactly one tensor per call, got ", ts.size());
  checkTensor(ts[0], op);
}

void checkSameDevice(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.defined() && b.defined(), "roce: ", op, ": got an undefined tensor");
  TORCH_CHECK(a.device() == b.device(), "roce: ", op, ": tensors on different devices (", a.device(),
              " and ", b.device(), "); pass all tensors of one call on the same device");
  checkTensor(a, op);
  checkTensor(b, op);
}

void checkSameDeviceAndDtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  checkSameDevice(a, b, op);
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "roce: ", op, ": tensors of different dtypes (",
              a.scalar_type(), " and ", b.scalar_type(), ")");
}

void checkRank(int64_t r, int size, const char* what, const char* op) {
  TORCH_CHECK(r >= 0 && r < size, "roce: ", op, ": invalid ", what, " rank ", r, " for a group of size ", size);
}

DataType reductionType(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    case at::kHalf: return DataType::Float16;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::UInt8;
    case at::kShort: return DataType::Int16;
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    case at::kBool: return DataType::Bool;
    case at::kComplexFloat: return DataType::Complex64;
    case at::kComplexDouble: return DataType::Complex128;
    default: break;
  }
  TORCH_CHECK(false, "roce: ", op, ": reductions over dtype ", t.scalar_type(),
              " are not supported (float32/64, float16, bfloat16, int8/16/32/64, uint8, bool, complex64/128 are)");
}

}  // namespace roce::adapter
