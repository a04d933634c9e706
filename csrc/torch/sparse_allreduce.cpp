#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "sparse_allreduce.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <cstdint>

#include <algorithm>

#include "../algorithms/algorithms.hpp"
#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "device_staging.hpp"

namespace roce::adapter {
using namespace roce::algorithms;
using namespace roce::comm;

namespace {

// What every rank tells the others first, as int64: the shape travels padded
// to kMaxDims so that the exchange has the same size on every rank even when
// the tensors do not.
enum Field : int64_t { kNnz, kSparseDim, kDenseDim, kDtype, kDims, kSizes };
constexpr int64_t kMaxDims = 64;
constexpr int64_t kFields = kSizes + kMaxDims;

std::string shapeOf(const int64_t* m) {
  std::string s = "[";
  for (int64_t d = 0; d < m[kDims]; ++d) s += (d ? ", " : "") + std::to_string(m[kSizes + d]);
  return str(s, "] (", m[kSparseDim], " sparse + ", m[kDenseDim], " dense dims, ",
             c10::toString(static_cast<c10::ScalarType>(m[kDtype])), ")");
}

const char* opNameOf(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "an unknown op";
  }
}

bool sameLayout(const int64_t* a, const int64_t* b) {
  return std::equal(a + kSparseDim, a + kSizes + a[kDims], b + kSparseDim);
}

}  // namespace

void checkSparseAllreduce(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "roce: allreduce takes exactly one tensor per call, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  TORCH_CHECK(t.layout() == at::kSparse, "roce: sparse allreduce supports sparse COO tensors only, got ", t.layout(),
              "; convert with .to_sparse() or .to_dense()");
  TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM, "roce: allreduce of a sparse tensor supports ReduceOp.SUM only, got ",
              opNameOf(opts.reduceOp.op_), "; convert with .to_dense() for other ops");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "roce: allreduce: sparse tensors on ", t.device(),
              " are not supported (cpu and cuda only)");
  TORCH_CHECK(t.dim() <= kMaxDims, "roce: sparse allreduce supports up to ", kMaxDims, " dimensions, got ", t.dim());
}

at::Tensor sparseAllreduceSum(Communicator& c, const at::Tensor& t) {
  at::NoGradGuard noGrad;
  // _indices()/_values() also accept an uncoalesced tensor; the sum below
  // coalesces anyway.
  const at::Tensor indices = t._indices().contiguous();  // sparseDim x nnz, int64
  const at::Tensor values = t._values().contiguous();    // nnz x dense sizes
  const int n = c.size();

  at::Tensor mine = at::zeros({kFields}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  m[kNnz] = t._nnz();
  m[kSparseDim] = t.sparse_dim();
  m[kDenseDim] = t.dense_dim();
  m[kDtype] = static_cast<int64_t>(t.scalar_type());
  m[kDims] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) m[kSizes + d] = t.size(d);
  at::Tensor all = at::empty({n, kFields}, at::kLong);
  roce::algorithms::allgather(c, mine.data_ptr(), all.data_ptr(), kFields * sizeof(int64_t));

  // Every rank sees the same table, so every rank raises alike (no rank is
  // left waiting in the exchanges below).
  const int64_t* table = all.data_ptr<int64_t>();
  int64_t maxNnz = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t* theirs = table + r * kFields;
    if (!sameLayout(theirs, table))
      throwInvalid(str("allreduce of a sparse tensor: rank ", r, " passed ", shapeOf(theirs), " but rank 0 passed ",
                       shapeOf(table), "; every rank must pass the same size, layout and dtype"));
    maxNnz = std::max(maxNnz, theirs[kNnz]);
  }
  const int64_t sparseDim = m[kSparseDim];
  // Elements per stored entry: the product of the dense dims (1 without any).
  int64_t rowNumel = 1;
  for (int64_t d = sparseDim; d < t.dim(); ++d) rowNumel *= t.size(d);
  std::vector<int64_t> rowShape = values.sizes().vec();  // nnz x dense sizes
  at::Tensor sum;
  if (maxNnz == 0) {
    sum = at::sparse_coo_tensor(indices, values, t.sizes());
  } else {
    // Blocks padded to the largest nnz, so both exchanges are plain allgathers.
    at::Tensor sendIdx = at::zeros({sparseDim, maxNnz}, at::kLong);
    sendIdx.narrow(1, 0, m[kNnz]).copy_(indices);
    at::Tensor sendVal = at::zeros({maxNnz * rowNumel}, values.options());
    sendVal.narrow(0, 0, m[kNnz] * rowNumel).copy_(values.reshape({-1}));
    at::Tensor gotIdx = at::empty({n, sparseDim, maxNnz}, at::kLong);
    at::Tensor gotVal = at::empty({n, maxNnz * rowNumel}, values.options());
    roce::algorithms::allgather(c, sendIdx.data_ptr(), gotIdx.data_ptr(), sendIdx.numel() * sizeof(int64_t));
    roce::algorithms::allgather(c, sendVal.data_ptr(), gotVal.data_ptr(), sendVal.numel() * sendVal.element_size());
    std::vector<at::Tensor> idx, val;
    for (int r = 0; r < n; ++r) {
      const int64_t nnz = table[r * kFields + kNnz];
      idx.push_back(gotIdx[r].narrow(1, 0, nnz));
      rowShape[0] = nnz;
      val.push_back(gotVal[r].narrow(0, 0, nnz * rowNumel).view(rowShape));
    }
    sum = at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), t.sizes());
  }
  return sum.coalesce();
}

void sparseAllreduceSumOnDevice(Communicator& c, const at::Tensor& t, const at::Tensor& indices,
                                const at::Tensor& values, DeviceStaging& staging, c10::Stream caller) {
  const at::Tensor sum = sparseAllreduceSum(c, at::_sparse_coo_tensor_unsafe(indices, values, t.sizes()));
  const at::Tensor sumIndices = sum._indices().pin_memory(), sumValues = sum._values().pin_memory();
  staging.queueOnResults([&] {
    at::Tensor onDevice = at::_sparse_coo_tensor_unsafe(sumIndices.to(t.device(), /*non_blocking=*/true),
                                                        sumValues.to(t.device(), /*non_blocking=*/true), t.sizes());
    onDevice._coalesced_(true);  // sparseAllreduceSum coalesced it
    t.copy_(onDevice);
    c10::impl::VirtualGuardImpl impl(t.device().type());
    impl.recordDataPtrOnStream(t._indices().storage().data_ptr(), caller);
    impl.recordDataPtrOnStream(t._values().storage().data_ptr(), caller);
  });
}

}  // namespace roce::adapter
