#include "tensor_staging.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "../common/error.hpp"

namespace roce {

void Staged::finish() const {
  if (!copyBack) return;
  at::NoGradGuard noGrad;
  c10::OptionalDeviceGuard guard(user.device());
  // Synchronous host-to-device copy for CUDA: the data is in place when the
  // Work completes.
  user.copy_(host.view(user.sizes()));
}

Staged stage(const at::Tensor& t, bool readable) {
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

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "roce: ", op, ": got an undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "roce: ", op, ": ", t.layout(),
              " tensors are not supported (only dense strided tensors); convert with .to_dense()");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "roce: ", op, ": tensors on ", t.device(),
              " are not supported (cpu and cuda only)");
}

void checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "roce: ", op, " takes exactly one tensor per call, got ", ts.size());
  checkTensor(ts[0], op);
}

void checkSameDeviceAndDtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.defined() && b.defined(), "roce: ", op, ": got an undefined tensor");
  TORCH_CHECK(a.device() == b.device(), "roce: ", op, ": tensors on different devices (", a.device(),
              " and ", b.device(), "); pass all tensors of one call on the same device");
  checkTensor(a, op);
  checkTensor(b, op);
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

Reduction toReduction(const c10d::ReduceOp& op, DataType t) {
  Reduction r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = ReduceOp::Sum; break;
    case c10d::ReduceOp::AVG: r.op = ReduceOp::Avg; break;
    case c10d::ReduceOp::PRODUCT: r.op = ReduceOp::Product; break;
    case c10d::ReduceOp::MIN: r.op = ReduceOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = ReduceOp::Max; break;
    case c10d::ReduceOp::BAND: r.op = ReduceOp::BAnd; break;
    case c10d::ReduceOp::BOR: r.op = ReduceOp::BOr; break;
    case c10d::ReduceOp::BXOR: r.op = ReduceOp::BXor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      r.op = ReduceOp::PreMulSum;
      // The older name: torch 2.11 has only it, newer torch keeps it as an alias.
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(sup, "roce: PREMUL_SUM without a factor; build it with torch.distributed._make_nccl_premul_sum");
      r.factor = sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
      break;
    }
    default:
      TORCH_CHECK(false, "roce: unsupported reduce op ", static_cast<int>(op.op_));
  }
  try {
    checkSupported(r.op, t);
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
  return r;
}

}  // namespace roce
