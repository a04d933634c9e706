#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "call_reduction.hpp"

#include <c10/util/Exception.h>

#include "../common/error.hpp"

namespace roce::adapter {
namespace {

// As c10::Error, which torch turns into the Python exception users expect.
void checkOperator(ReduceOp op, DataType t) {
  try {
    checkSupported(op, t);
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The operator alone, checked against `t`; the factor of a PREMUL_SUM is the
// caller's (a device tensor's is read later).
Reduction operatorOf(const c10d::ReduceOp& op, DataType t) {
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
    case c10d::ReduceOp::PREMUL_SUM: r.op = ReduceOp::PreMulSum; break;
    default:
      TORCH_CHECK(false, "roce: unsupported reduce op ", static_cast<int>(op.op_));
  }
  checkOperator(r.op, t);
  return r;
}

// The older name: torch 2.11 has only it, newer torch keeps it as an alias.
const c10d::NCCLPreMulSumSupplement& premulSupplement(const c10d::ReduceOp& op) {
  auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(sup, "roce: PREMUL_SUM without a factor; build it with torch.distributed._make_nccl_premul_sum");
  return *sup;
}

}  // namespace

CallReduction::CallReduction(const c10d::ReduceOp& op, DataType t, CallStaging& st) : red_(operatorOf(op, t)) {
  if (red_.op != ReduceOp::PreMulSum) return;
  const auto& sup = premulSupplement(op);
  const at::Tensor& f = sup.tensor_factor;
  if (!f.defined()) {
    red_.factor = sup.double_factor;
    return;
  }
  TORCH_CHECK(f.numel() == 1, "roce: PREMUL_SUM's factor must be one element, got a tensor of shape ", f.sizes());
  TORCH_CHECK(!f.is_complex(), "roce: PREMUL_SUM's factor must be real, got ", f.scalar_type());
  if (f.is_cpu() || !st.device || f.device() != st.device->device()) {
    red_.factor = f.item<double>();  // host memory, or a device the call's streams do not order against
    return;
  }
  hostFactor_ = st.device->hostBuffer(1, f.scalar_type()).view(f.sizes());
  st.device->add(f, hostFactor_, /*read=*/true, /*write=*/false, /*offset=*/0);
}

CallReduction CallReduction::forType(DataType t) const {
  checkOperator(red_.op, t);
  return *this;
}

Reduction CallReduction::get() const {
  Reduction r = red_;
  if (hostFactor_.defined()) r.factor = hostFactor_.item<double>();
  return r;
}

}  // namespace roce::adapter
