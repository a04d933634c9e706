// Reductions of staged device tensors on the device (ROCE_PG_DEVICE_REDUCE,
// docs/ACCELERATORS.md "Where staged reductions run"). The host only moves
// bytes; every arithmetic operation runs as device-generic ATen ops on the
// group's reduce stream (which waits for nothing of the caller), so the same
// source serves CUDA, ROCm and any PrivateUse1 device, and the host's cores
// are left to the copies.
//
// Allreduce of one staged piece of `count` elements among p ranks, rank r
// owning the slice [count*r/p, count*(r+1)/p):
//   1. exchange (alltoallv, host): slice j of every rank's piece goes to rank
//      j, so rank r holds all p contributions to its slice, one row per rank;
//   2. device: the p rows go to the device, are reduced there in rank order
//      (each rank reduces its own slice, so every rank ends up with the same
//      bits), and the reduced slice comes back into the piece;
//   3. allgather (alltoallv, host): every rank sends its reduced slice to all
//      (reduce: to the root only).
// Reduce-scatter is steps 1 and 2 with one block per rank.
//
// Bytes per payload byte, p ranks: network 2(p-1)/p (as a ring); PCIe 1 + 1/p
// out and 2 in (host reductions: 1 and 1); host memory: copies only.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include "../common/dtype.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::adapter {
using namespace roce::comm;


// The rows of `rows` (a device tensor, p x m) reduced along dimension 0 by
// `red`, with the host kernels' semantics: integers wrap, AVG and PREMUL_SUM
// truncate integers toward zero, PREMUL_SUM scales each row before summing,
// SUM/PRODUCT/MIN/MAX of bool are or/and/and/or. Runs on the current stream.
at::Tensor reduceRowsOnDevice(const at::Tensor& rows, Reduction red);

// Launches, from the thread issuing a call, each device kernel the call's
// reductions will launch from the progress thread (those of `op` on p x m
// rows of `dtype`, for every m the call's slices have, m capped at 65,536),
// once per process for each (device, dtype, op, p, m); the scratch rows are
// allocated on `stream`, as the reduction's are. A failure is a warning.
// Why: under CUDA's lazy module loading (the default since CUDA 12.2) a
// kernel's first launch may wait for all work queued on the device
// (docs/ACCELERATORS.md, "Calls that wait for the whole device"). Made
// first by the progress thread, that wait would hold the call behind the
// work its caller queued after issuing it (a backward pass: DDP's overlap is
// gone, and a kernel waiting on another rank would deadlock). Made here, the
// caller's first call of each kind waits for the caller's own earlier work.
// pieceElems 0: one piece of `total` elements (reduce-scatter: m = total).
void prepareDeviceReduction(c10::Stream stream, at::ScalarType dtype, ReduceOp op, int p, int me, int64_t total,
                            int64_t pieceElems);

// In place on `piece` (a pinned host tensor of count elements, this rank's
// contribution on entry, the result on return: on every rank for root -1
// (allreduce), else on `root` only (reduce; the others' piece then holds
// their own reduced slice and is not copied back). `rows`: a pinned host
// buffer of at least p * ceil(count / p) elements of the same dtype. The
// device steps run on `stream`; the call returns once the result is in `piece`.
void reduceReducingOnDevice(Communicator& c, c10::Stream stream, const at::Tensor& piece, const at::Tensor& rows,
                            Reduction red, int root);

// `input`: p blocks of out.numel() elements (pinned host); `out`: this rank's
// reduced block (pinned host). `rows`: pinned host, input.numel() elements.
void reduceScatterReducingOnDevice(Communicator& c, c10::Stream stream, const at::Tensor& input,
                                   const at::Tensor& rows, const at::Tensor& out, Reduction red);

}  // namespace roce::adapter
