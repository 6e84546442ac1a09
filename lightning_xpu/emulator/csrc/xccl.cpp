// The emulated "xccl" collective backend: gloo on host views of the xpu tensors.
//
// A c10d::Backend registered for the xpu device type (what ProcessGroupXCCL is on a real XPU build), so
// ProcessGroup routing, object collectives, device_id binding, DeviceMesh and functional collectives see an
// xpu backend. Each collective runs gloo on CPU tensors that alias the device memory (no copies) and waits
// for it; the returned Work is complete and its future holds the xpu tensors (DDP's reducer reads it).
// ReduceOp.AVG, which gloo lacks, is SUM followed by a division (as oneCCL's reduction::avg, see average());
// reduce-scatter is an all-reduce of the input followed by taking this rank's chunk (gloo's support for it
// varies across torch versions).
// Reduction ops, dtypes and tensors XCCL does not support (not dense on an xpu device, not contiguous, on another
// device than the rank's) fail with ProcessGroupXCCL's exception types and messages
// (torch-xpu-ops src/xccl/ProcessGroupXCCL.cpp). With the asynchronous device model (the default), an
// async_op=True collective keeps its results back: its outputs change at Work.wait() (or a device synchronize).
// float8 tensors travel through gloo as bytes where XCCL moves them as uint8 (every collective that does not reduce);
// TORCH_XCCL_NAN_CHECK=1 checks the inputs ProcessGroupXCCL checks and aborts the process as the device-side assert
// does (xccl_check_for_nan); startCoalescing/endCoalescing group collectives and point-to-point ops as there.

#include "emulator.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdio>
#include <cstdlib>
#include <set>

namespace xpu_emu {

namespace {

using c10d::OpType;
using c10d::Work;

class DoneWork final : public Work {
 public:
  DoneWork(std::vector<at::Tensor> result, OpType type) : Work(-1, type), result_(std::move(result)) {
    std::vector<c10::Device> devices;
    for (const auto& t : result_)
      if (t.defined() && t.device().type() == c10::DeviceType::XPU &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work of an async collective whose results land at wait(), synchronize() or a device synchronize. Its future
// is complete once taken: DDP's reducer waits on futures (c10::ivalue::Future::wait cannot be intercepted), so
// taking the future counts as waiting.
class DeferredWork final : public Work {
 public:
  DeferredWork(std::vector<at::Tensor> result, OpType type, std::vector<uint64_t> ids)
      : Work(-1, type), result_(std::move(result)), ids_(std::move(ids)) {
    std::vector<c10::Device> devices;
    for (const auto& t : result_)
      if (t.defined() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  }
  bool isCompleted() override { return landed(ids_); }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override {
    land_ids(ids_);
    return true;
  }
  void synchronize() override { land_ids(ids_); }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    land_ids(ids_);
    if (!future_->completed()) future_->markCompleted(c10::IValue(result_));
    return future_;
  }

 private:
  std::vector<at::Tensor> result_;
  std::vector<uint64_t> ids_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// What gloo moves: the tensor's host view, float8 as bytes. XCCL moves the four float8 dtypes as uint8 (its
// getXcclDataType maps them to ccl::datatype::uint8) in every collective that does not reduce; gloo has no float8
// ("Invalid scalar type"). Reductions refuse float8 before they get here (check_dtypes).
at::Tensor wire(const at::Tensor& t) {
  auto v = host_view(t);
  return c10::isFloat8Type(v.scalar_type()) ? v.view(at::kByte) : v;
}

std::vector<at::Tensor> views(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(wire(t));
  return out;
}

std::vector<std::vector<at::Tensor>> views(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& l : ts) out.push_back(views(l));
  return out;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& l : ts) out.insert(out.end(), l.begin(), l.end());
  return out;
}

void finish(const c10::intrusive_ptr<Work>& w) { w->wait(); }

// The modelled torch release's minor version (LIGHTNING_XPU_EMULATOR_TORCH): PREMUL_SUM differs between releases.
int torch_minor = 13;

// Reductions gloo cannot do itself become SUM (+ division for AVG, see average(), and the factor of PREMUL_SUM).
bool is_avg(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::AVG; }
bool is_premul_sum(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::PREMUL_SUM; }

c10d::ReduceOp gloo_op(const c10d::ReduceOp& op) {
  return is_avg(op) || op.op_ == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

// Multiplies what a rank contributes by PREMUL_SUM's factor, in place. From 2.12 ProcessGroupXCCL does this to the
// caller's input itself; in 2.11 oneCCL scales inside the reduction and the input is left as it was.
void premultiply(const at::Tensor& contribution, const c10d::ReduceOp& op) {
  if (!is_premul_sum(op)) return;
  const auto* factor = reinterpret_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (factor->tensor_factor.defined())
    contribution.mul_(factor->tensor_factor.is_xpu() ? host_view(factor->tensor_factor) : factor->tensor_factor);
  else
    contribution.mul_(factor->double_factor);
}

// Turns the SUM of `size` ranks into their AVG, in place, as ProcessGroupXCCL's AVG does: every torch XPU wheel from
// the floor up is built against oneCCL >= 2021.15 (2.8 ships 2021.15, 2.9 2021.16, 2.10 and later 2021.17), so AVG is
// oneCCL's ccl::reduction::avg (XCCL_HAS_AVG), which divides the sum in the tensor's own type: integers truncate
// (unverified on hardware for negative sums, see README.md), as NCCL's ncclAvg does.
void average(at::Tensor& t, int64_t size) {
  if (t.is_floating_point() || t.is_complex())
    t.div_(size);
  else
    t.div_(size, "trunc");
}


// As ProcessGroupXCCL's getXcclReduceOp: XCCL has MIN, MAX, SUM, PRODUCT and AVG. PREMUL_SUM: refused up to 2.10;
// oneCCL's own pre-multiplied sum for floating types in 2.11 (its wheels ship oneCCL 2021.17); from 2.12 the input is
// multiplied by the factor in place and summed, for every dtype (applyPreMulSumIfNeeded).
void check_op(const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts = {}) {
  using R = c10d::ReduceOp;
  const char* name = nullptr;
  switch (op.op_) {
    case R::BAND: name = "BAND"; break;
    case R::BOR: name = "BOR"; break;
    case R::BXOR: name = "BXOR"; break;
    case R::PREMUL_SUM:
      if (torch_minor <= 10) name = "PREMUL_SUM";
      if (torch_minor == 11)
        for (const auto& t : ts)
          TORCH_CHECK_WITH(TypeError, at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kFloat8_e5m2 &&
                                          t.scalar_type() != at::kFloat8_e4m3fn,
                           "PreMulSum Data type must be half, float, bfloat16 or double");
      break;
    default: break;
  }
  if (name != nullptr) C10_THROW_ERROR(ValueError, std::string("Cannot use ReduceOp.") + name + " with XCCL");
  for (const auto& t : ts)
    if (t.scalar_type() == at::kBool && op.op_ == R::AVG)  // XCCL_HAS_AVG's check
      C10_THROW_ERROR(TypeError, "Cannot use ReduceOp.AVG with boolean inputs");
}

// As ProcessGroupXCCL's getXcclDataType (complex tensors travel as their real view, as there).
void check_dtypes(const std::vector<at::Tensor>& ts, bool reduction) {
  for (const auto& t : ts) {
    auto type = t.is_complex() ? c10::toRealValueType(t.scalar_type()) : t.scalar_type();
    if (reduction)  // the typo is release/2.8 to 2.10's; xccl.h fixed it in 2.11
      TORCH_CHECK(!c10::isFloat8Type(type), "Float8 dtypes are not ", torch_minor <= 10 ? "currenlty" : "currently",
                  " supported for XCCL reductions");
    switch (type) {
      case at::kByte: case at::kChar: case at::kInt: case at::kLong: case at::kHalf: case at::kFloat:
      case at::kDouble: case at::kBFloat16: case at::kBool: case at::kFloat8_e5m2: case at::kFloat8_e4m3fn:
      case at::kFloat8_e4m3fnuz: case at::kFloat8_e5m2fnuz:
        break;
      default:
        TORCH_CHECK_WITH(TypeError, false, "Input tensor data type is not supported for XCCL process group: ", type);
    }
  }
}
void check_dtypes(const std::vector<std::vector<at::Tensor>>& ts, bool reduction) {
  for (const auto& l : ts) check_dtypes(l, reduction);
}

// As ProcessGroupXCCL's checkSingleTensor: a dense xpu tensor, contiguous in its suggested memory format (point-to-
// point ops only warn). Gloo on the host view of a non-contiguous tensor would reduce the wrong elements.
void check_single(const at::Tensor& t, bool p2p = false) {
  if (!t.is_xpu() || t.is_sparse()) C10_THROW_ERROR(ValueError, "Tensors must be XPU and dense");
  if (t.is_contiguous(t.suggest_memory_format())) return;
  if (!p2p) C10_THROW_ERROR(ValueError, "Tensors must be contiguous");
  TORCH_WARN_ONCE("Detected non-contiguous tensor in P2P operations. It is user responsibility to guarantee that ",
                  "source and destination tensors have the same contiguity format.");
}
void check_single(const std::vector<at::Tensor>& ts, bool p2p = false) {
  for (const auto& t : ts) check_single(t, p2p);
}

// TORCH_XCCL_NAN_CHECK=1 (torch-xpu-ops src/xccl/NanCheck_XPU.cpp, from release/2.9): before a collective,
// ProcessGroupXCCL runs the checkForNaN kernel over the inputs it checks (see each collective below), and a NaN trips
// its assert(0): the SYCL runtime prints the device assert's line to stderr and aborts the process (SIGABRT). Here
// the check runs on the host memory when the collective is called (on hardware the kernel runs ahead of the
// collective on the same stream), and aborts the same way. Up to release/2.12 the kernel is dispatched before any
// other check, so a tensor of another dtype than float, double, half, bfloat16, float8_e4m3fn or float8_e5m2
// (integers, bool, the fnuz float8s) raises the dispatch error instead; release/2.13 returns first for tensors that
// are not floating point or are empty.
struct NanAssertLines {  // NanCheck_XPU.cpp's assert(0) lines in the release
  int pack2, pack4, pack8, pack16, head, tail;
};

NanAssertLines nan_assert_lines() {
  if (torch_minor >= 13) return {44, 54, 65, 112, 154, 174};
  if (torch_minor >= 11) return {42, 52, 63, 110, 152, 172};
  return {32, 42, 53, 100, 142, 162};
}

const char* nan_check_type_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float";
    case at::kDouble: return "double";
    case at::kHalf: return "c10::Half";
    case at::kBFloat16: return "c10::BFloat16";
    case at::kFloat8_e4m3fn: return "c10::Float8_e4m3fn";
    default: return "c10::Float8_e5m2";
  }
}

// Where the kernel finds the NaN at element `e` of `n` (the work-item that reads it, the assert it trips): 16-byte
// packs after an unaligned head, a tail read by the first work-items of each group; work-groups of
// min(1024, n) items (the emulated devices' max_work_group_size), at most 24 of them from release/2.13.
[[noreturn]] void nan_assert(const at::Tensor& t, int64_t e, size_t elem_size) {
  const auto lines = nan_assert_lines();
  const auto n = static_cast<uint64_t>(t.numel());
  const auto epp = 16 / elem_size;
  const uint64_t threads = std::min<uint64_t>(1024, n);
  uint64_t blocks = (n + threads - 1) / threads;
  if (torch_minor >= 13) blocks = std::min<uint64_t>(blocks, 24);
  const uint64_t range = blocks * threads;
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uint64_t head = std::min<uint64_t>(((addr + 15) / 16 * 16 - addr) / elem_size, n);
  const uint64_t packs = (n - head) * elem_size / 16;
  const auto u = static_cast<uint64_t>(e);
  uint64_t id = 0;
  int line = 0;
  bool in_pack = false;
  if (u < head) {
    id = u;
    line = lines.head;
  } else if ((u - head) / epp < packs) {
    id = (u - head) / epp % range;
    line = epp == 2 ? lines.pack2 : epp == 4 ? lines.pack4 : epp == 8 ? lines.pack8 : lines.pack16;
    in_pack = true;
  } else {
    id = u - head - packs * epp;
    line = lines.tail;
  }
  const char* type = nan_check_type_name(t.scalar_type());
  std::string function = in_pack ? "static void c10d::CheckBytePack<" + std::string(type) + ", " +
                                        std::to_string(epp) + ">::check(BytePack *) [T = " + type + "]"
                                  : "void c10d::checkForNaN<" + std::string(type) +
                                        ">::operator()(sycl::nd_item<1>) const [T = " + type + "]";
  std::fprintf(stderr, "%s:%d: %s: global id: [%llu,0,0], local id: [%llu,0,0] Assertion `0` failed.\n",
               "third_party/torch-xpu-ops/src/xccl/NanCheck_XPU.cpp", line, function.c_str(),
               static_cast<unsigned long long>(id), static_cast<unsigned long long>(id % threads));
  std::fflush(stderr);
  std::abort();
}

void xccl_check_for_nan(const at::Tensor& t) {
  if (torch_minor >= 13 && (!t.is_floating_point() || t.numel() == 0)) return;
  AT_DISPATCH_FLOATING_TYPES_AND4(at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn, at::kFloat8_e5m2, t.scalar_type(),
                                  "checkForNaN_XPU", [&] {
                                    if (t.numel() == 0) return;
                                    // the kernel reads numel() elements from data_ptr() on: dense memory, any order
                                    auto flat = host_view(t).as_strided({t.numel()}, {1});
                                    auto nan = c10::isFloat8Type(t.scalar_type()) ? flat.to(at::kFloat).isnan()
                                                                                   : flat.isnan();
                                    if (!nan.any().item<bool>()) return;
                                    nan_assert(t, nan.to(at::kByte).argmax().item<int64_t>(), sizeof(scalar_t));
                                  });
}

class EmuXccl final : public c10d::Backend {
 public:
  EmuXccl(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
      : Backend(rank, size),
        gloo_(std::move(gloo)),
        global_rank_(process_global_rank(rank)),
        // read when the backend is built, as ProcessGroupXCCL's constructor reads it (getCvarBool)
        nan_check_(torch_minor >= 9 && c10d::getCvarBool({"TORCH_XCCL_NAN_CHECK"}, false)) {}

  const std::string getBackendName() const override { return "xccl"; }

  // ProcessGroupXCCL::supportsCoalescing is true in every release, so batch_isend_irecv and
  // _coalescing_manager(device=...) call startCoalescing/endCoalescing.
  bool supportsCoalescing() const override { return true; }

  // As ProcessGroupXCCL::startCoalescing/endCoalescing: the collectives and point-to-point ops in between form one
  // group; endCoalescing returns nothing if none ran, else one Work for all of them if the last collective was
  // async_op=True or any point-to-point op ran (coalescedAsync_), else nothing (they completed on the stream).
  // Point-to-point ops are posted to gloo at once and completed here, so a rank may post a recv before its send, as in
  // a oneCCL group; what they receive lands with the group's Work, as an async collective's output does.
  void startCoalescing() override {
    coalescing_ = true;
    coalesced_any_ = false;
    coalesced_async_ = false;
    coalesced_ids_.clear();
    pending_.clear();
    pending_recvs_.clear();
  }

  c10::intrusive_ptr<Work> endCoalescing() override {
    coalescing_ = false;
    for (const auto& w : pending_) finish(w);
    pending_.clear();
    for (auto& [t, scratch] : pending_recvs_) {
      auto memory = wire(t);
      const auto d = t.device().index();
      if (is_async()) {
        coalesced_ids_.push_back(defer_collective(d, memory, scratch));
        sanitizer_access_at(t, true, kCollectiveStreamId, collective_position(d), "XCCL recv", "tensor");
      } else {
        memory.copy_(scratch);
      }
    }
    pending_recvs_.clear();
    if (!coalesced_any_ || !coalesced_async_) return {};
    return c10::make_intrusive<DeferredWork>(std::vector<at::Tensor>{}, OpType::COALESCED, std::move(coalesced_ids_));
  }

  // Runs `body`, which writes the outputs' memory; an async op's results are then held back until wait().
  template <typename F>
  c10::intrusive_ptr<Work> run(const std::vector<at::Tensor>& outs, OpType type, bool async_op, F body) {
    check_device(outs);
    for (const auto& t : outs) used_.insert(t.device().index());
    if (coalescing_) {
      coalesced_any_ = true;
      coalesced_async_ = async_op;  // the last collective's, as coalescedAsync_
    }
    const bool hold = async_op && is_async();
    std::vector<at::Tensor> before;
    if (hold)
      for (const auto& t : outs) before.push_back(host_view(t).clone());
    body();
    if (!hold) {
      for (const auto& t : outs) sanitizer_access(t, true, "XCCL collective", "output");
      return c10::make_intrusive<DoneWork>(outs, type);
    }
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < outs.size(); ++i) {
      auto memory = host_view(outs[i]);
      auto result = memory.clone();
      memory.copy_(before[i]);
      const auto d = outs[i].device().index();
      ids.push_back(defer_collective(d, memory, result));
      sanitizer_access_at(outs[i], true, kCollectiveStreamId, collective_position(d), "XCCL collective", "output");
    }
    if (coalescing_) coalesced_ids_.insert(coalesced_ids_.end(), ids.begin(), ids.end());
    return c10::make_intrusive<DeferredWork>(outs, type, std::move(ids));
  }

  // The inputs ProcessGroupXCCL's collective() checks under TORCH_XCCL_NAN_CHECK=1 (nanCheck), before its reduce op and
  // dtype are looked up.
  void nan_check(const std::vector<at::Tensor>& ts, bool checked = true) const {
    if (!nan_check_ || !checked) return;
    for (const auto& t : ts) xccl_check_for_nan(t);
  }

  // ProcessGroupXCCL keys its communicators by device: on hardware a collective on a device other than the rank's
  // waits for peers that never come; here it fails at once.
  void check_device(const std::vector<at::Tensor>& ts) const {
    if (getSize() < 2) return;
    for (const auto& t : ts) {
      if (!t.is_xpu()) continue;
      const c10::DeviceIndex own = getBoundDeviceId().has_value() ? getBoundDeviceId()->index()
                                   : !used_.empty()               ? *used_.begin()
                                                                  : t.device().index();
      TORCH_CHECK_WITH(DistBackendError, t.device().index() == own, "XCCL collective on xpu:",
                       static_cast<int>(t.device().index()), ", but rank ", getRank(), " runs on xpu:",
                       static_cast<int>(own), " (on an Intel GPU it waits for peers on that device that never come; ",
                       "move the tensor to the rank's device)");
    }
  }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& opts) override {
    check_single(ts);
    nan_check(ts, opts.rootRank + opts.rootTensor == getRank());
    check_dtypes(ts, false);
    return run(ts, OpType::BROADCAST, opts.asyncOp, [&] {
      auto v = views(ts);
      finish(gloo_->broadcast(v, opts));
    });
  }

  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& opts) override {
    check_single(ts);
    nan_check(ts);
    check_op(opts.reduceOp, ts);
    check_dtypes(ts, true);
    return run(ts, OpType::ALLREDUCE, opts.asyncOp, [&] { allreduce_now(ts, opts); });
  }

  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& ts,
                                               const c10d::AllreduceCoalescedOptions& opts) override {
    check_op(opts.reduceOp, ts);
    check_dtypes(ts, true);
    return run(ts, OpType::ALLREDUCE_COALESCED, opts.asyncOp, [&] {
      for (auto& t : ts) {
        std::vector<at::Tensor> one{t};
        c10d::AllreduceOptions o;
        o.reduceOp = opts.reduceOp;
        o.timeout = opts.timeout;
        allreduce_now(one, o);
      }
    });
  }

  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& opts) override {
    check_single(ts);
    nan_check(ts);
    check_op(opts.reduceOp, ts);
    check_dtypes(ts, true);
    return run(ts, OpType::REDUCE, opts.asyncOp, [&] {
      auto v = views(ts);
      auto o = opts;
      o.reduceOp = gloo_op(opts.reduceOp);
      if (is_premul_sum(opts.reduceOp) && torch_minor == 11 && getRank() != opts.rootRank)
        for (auto& t : v) t = t.clone();  // only the root's tensor changes
      for (auto& t : v) premultiply(t, opts.reduceOp);
      finish(gloo_->reduce(v, o));
      if (is_avg(opts.reduceOp) && getRank() == opts.rootRank)
        for (auto& t : v) average(t, getSize());
    });
  }

  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                     const c10d::AllgatherOptions& opts) override {
    check_single(ins);
    nan_check(ins);
    check_dtypes(ins, false);
    return run(flat(outs), OpType::ALLGATHER, opts.asyncOp, [&] {
      auto vo = views(outs);
      auto vi = views(ins);
      finish(gloo_->allgather(vo, vi, opts));
    });
  }

  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_WITH(TypeError, in.dtype() == out.dtype(), "output tensor must have the same type as input tensor");
    TORCH_CHECK_WITH(ValueError, out.numel() == in.numel() * getSize(),
                     "output tensor size must be equal to world_size times input size");
    check_single(in);
    check_single(out);
    nan_check({in});
    check_dtypes({in}, false);
    return run({out}, OpType::_ALLGATHER_BASE, opts.asyncOp, [&] { allgather_base_now(out, in, opts); });
  }

  // no allgather_coalesced: ProcessGroupXCCL has none (release/2.8 to 2.13), so c10d's Backend refuses it

  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                                           const c10d::AllgatherOptions& opts) override {
    check_dtypes(ins, false);
    return run(outs, OpType::COALESCED, opts.asyncOp, [&] {
      for (size_t i = 0; i < ins.size(); ++i) allgather_base_now(outs[i], ins[i], opts);
    });
  }

  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                  const c10d::GatherOptions& opts) override {
    check_single(ins);
    nan_check(ins);
    check_dtypes(ins, false);
    return run(flat(outs), OpType::GATHER, opts.asyncOp, [&] {
      auto vo = views(outs);
      auto vi = views(ins);
      finish(gloo_->gather(vo, vi, opts));
    });
  }

  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                   const c10d::ScatterOptions& opts) override {
    check_single(outs);
    nan_check(outs, opts.rootRank == getRank());  // the output: ProcessGroupXCCL passes it as collective()'s input
    check_dtypes(outs, false);
    return run(outs, OpType::SCATTER, opts.asyncOp, [&] {
      auto vo = views(outs);
      auto vi = views(ins);
      finish(gloo_->scatter(vo, vi, opts));
    });
  }

  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_WITH(TypeError, in.dtype() == out.dtype(), "input tensor must be the same type as the output tensor.");
    TORCH_CHECK_WITH(ValueError, in.numel() == out.numel() * getSize(),
                     "input tensor must be the same size as output size times world size");
    check_single(in);
    check_single(out);
    nan_check({in});
    check_op(opts.reduceOp, {in});
    check_dtypes({in}, true);
    return run({out}, OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, [&] {
      at::Tensor out_host = host_view(out);
      auto flat_out = at::empty({out.numel()}, out_host.options());
      _reduce_scatter_host(flat_out, host_view(in).reshape({-1}), opts);
      out_host.copy_(flat_out.view(out_host.sizes()));
    });
  }

  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                          const c10d::ReduceScatterOptions& opts) override {
    check_single(outs);
    nan_check(flat(ins));
    check_op(opts.reduceOp, outs);
    check_dtypes(outs, true);
    return run(outs, OpType::REDUCE_SCATTER, opts.asyncOp, [&] {
      for (size_t i = 0; i < outs.size(); ++i) {
        std::vector<at::Tensor> parts;
        for (const auto& t : ins[i]) parts.push_back(host_view(t).reshape({-1}));
        auto stacked = at::cat(parts);
        at::Tensor out_flat = at::empty({outs[i].numel()}, stacked.options());
        at::Tensor out_host = host_view(outs[i]);
        _reduce_scatter_host(out_flat, stacked, opts);
        out_host.copy_(out_flat.view(out_host.sizes()));
      }
    });
  }

  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                                           const c10d::ReduceScatterOptions& opts) override {
    check_op(opts.reduceOp, ins);
    check_dtypes(ins, true);
    return run(outs, OpType::COALESCED, opts.asyncOp, [&] {
      for (size_t i = 0; i < outs.size(); ++i) {
        at::Tensor out_host = host_view(outs[i]);
        auto flat_out = at::empty({outs[i].numel()}, out_host.options());
        _reduce_scatter_host(flat_out, host_view(ins[i]).reshape({-1}), opts);
        out_host.copy_(flat_out.view(out_host.sizes()));
      }
    });
  }

  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                         std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& opts) override {
    check_single(in);
    check_single(out);
    nan_check({in});
    check_dtypes({in}, false);
    return run({out}, OpType::ALLTOALL_BASE, opts.asyncOp, [&] {
      auto vo = wire(out);
      auto vi = wire(in);
      finish(gloo_->alltoall_base(vo, vi, out_splits, in_splits, opts));
    });
  }

  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                    const c10d::AllToAllOptions& opts) override {
    nan_check(ins);
    check_dtypes(ins, false);
    return run(outs, OpType::ALLTOALL, opts.asyncOp, [&] {
      auto vo = views(outs);
      auto vi = views(ins);
      finish(gloo_->alltoall(vo, vi, opts));
    });
  }

  // In a coalescing group (batch_isend_irecv) ProcessGroupXCCL returns no Work of its own: the group's comes from
  // endCoalescing.
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    check_single(ts, /*p2p=*/true);
    check_device(ts);
    nan_check(ts);
    check_dtypes(ts, false);
    auto v = views(ts);
    if (coalescing_) {
      coalesced_any_ = coalesced_async_ = true;
      for (const auto& t : ts) used_.insert(t.device().index());
      pending_.push_back(gloo_->send(v, dst, tag));
      return {};
    }
    finish(gloo_->send(v, dst, tag));
    return c10::make_intrusive<DoneWork>(ts, OpType::SEND);
  }

  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    check_single(ts, /*p2p=*/true);
    check_device(ts);
    check_dtypes(ts, false);
    if (coalescing_) {
      coalesced_any_ = coalesced_async_ = true;
      std::vector<at::Tensor> scratch;
      for (const auto& t : ts) {
        used_.insert(t.device().index());
        scratch.push_back(at::empty_like(wire(t)));
        pending_recvs_.emplace_back(t, scratch.back());
      }
      pending_.push_back(gloo_->recv(scratch, src, tag));
      return {};
    }
    auto v = views(ts);
    finish(gloo_->recv(v, src, tag));
    return c10::make_intrusive<DoneWork>(ts, OpType::RECV);
  }

  // As ProcessGroupXCCL::barrier: an all-reduce of one element on device_ids[0], else the bound device, else the
  // first device a collective used, else a guess from the rank (guess_device()). A group neither bound nor used yet
  // takes that device as its own, as its first collective's device would be (ProcessGroupXCCL builds its communicator
  // there, whatever device the process set: barrier(device_ids=[rank]) in a rank that never called set_device runs).
  // After that each emulated device belongs to one rank: a barrier on another device than the group's is refused
  // (XCCL would build a second communicator over it).
  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions& opts) override {
    c10::DeviceIndex dev = -1;
    if (!opts.device_ids.empty()) {
      dev = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
    } else if (getBoundDeviceId().has_value()) {
      dev = getBoundDeviceId()->index();
    } else if (!used_.empty()) {
      dev = *used_.begin();
    } else {
      dev = guess_device();
    }
    TORCH_CHECK_WITH(ValueError, dev >= 0, "Failed to infer a GPU device id to perform barrier. ");
    const c10::DeviceIndex own = getBoundDeviceId().has_value() ? getBoundDeviceId()->index()
                                 : !used_.empty()               ? *used_.begin()
                                                                : dev;
    TORCH_CHECK_WITH(DistBackendError, dev == own, "XCCL barrier on xpu:", static_cast<int>(dev), ", but rank ",
                     getRank(), " runs on xpu:", static_cast<int>(own), " (emulated: each device belongs to one ",
                     "rank; pass device_ids=[", static_cast<int>(own), "] or init_process_group(device_id=...))");
    used_.insert(dev);
    c10d::BarrierOptions o;  // gloo synchronises host threads; device ids mean nothing to it
    o.timeout = opts.timeout;
    finish(gloo_->barrier(o));
    return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{}, OpType::BARRIER);
  }

  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }

 private:
  void _reduce_scatter_host(at::Tensor& out_flat, const at::Tensor& in_flat, const c10d::ReduceScatterOptions& opts) {
    if (torch_minor >= 12) premultiply(in_flat, opts.reduceOp);
    std::vector<at::Tensor> sum{in_flat.clone()};
    if (torch_minor == 11) premultiply(sum[0], opts.reduceOp);
    c10d::AllreduceOptions o;
    o.reduceOp = gloo_op(opts.reduceOp);
    o.timeout = opts.timeout;
    finish(gloo_->allreduce(sum, o));
    auto mine = sum[0].narrow(0, getRank() * out_flat.numel(), out_flat.numel());
    if (is_avg(opts.reduceOp)) average(mine, getSize());  // `mine` is a view of the scratch copy `sum`
    out_flat.copy_(mine);
  }

  void allreduce_now(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& opts) {
    auto v = views(ts);
    auto o = opts;
    o.reduceOp = gloo_op(opts.reduceOp);
    for (auto& t : v) premultiply(t, opts.reduceOp);  // the input is the output: in place on every release
    finish(gloo_->allreduce(v, o));
    if (is_avg(opts.reduceOp))
      for (auto& t : v) average(t, getSize());
  }

  void allgather_base_now(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& opts) {
    auto chunks = wire(out).view({-1}).chunk(getSize());
    std::vector<std::vector<at::Tensor>> vo{std::vector<at::Tensor>(chunks.begin(), chunks.end())};
    std::vector<at::Tensor> vi{wire(in).view({-1})};
    finish(gloo_->allgather(vo, vi, opts));
  }

  // The device of a barrier on a group that is neither bound nor used yet. 2.8: the group rank modulo the device
  // count, silently; 2.9 (guessDeviceId): the same with a warning in the log; from 2.10 the global rank (globalRank():
  // the rank of the process's first group) instead of the group rank. The warning is LOG(WARNING) there, so a line on
  // stderr, never a Python warning (warning filters neither hide it nor turn it into an error).
  c10::DeviceIndex guess_device() const {
    const int count = c10::impl::getDeviceGuardImpl(c10::DeviceType::XPU)->deviceCount();
    const auto dev = static_cast<c10::DeviceIndex>((torch_minor >= 10 ? global_rank_ : getRank()) % count);
    if (torch_minor >= 9)
      LOG(WARNING) << "[PG GUID " << pg_uid_ << " Rank " << getRank() << "] " << " using GPU " << static_cast<int>(dev)
                   << " as device used by this process is currently unknown. "
                   << "This can potentially cause a hang if this rank to GPU mapping is incorrect. "
                   << "You can specify device_id in init_process_group() to force use of a particular device.";
    return dev;
  }

  // ProcessGroupXCCL::globalRank() is a function-local static: the rank given to the first group the process builds.
  static int process_global_rank(int rank) {
    static const int first = rank;
    return first;
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::set<c10::DeviceIndex> used_;  // devices this rank's collectives ran on
  const int global_rank_;
  const bool nan_check_;  // TORCH_XCCL_NAN_CHECK, from the 2.9 profile
  // between startCoalescing and endCoalescing
  bool coalescing_ = false;
  bool coalesced_any_ = false;
  bool coalesced_async_ = false;
  std::vector<uint64_t> coalesced_ids_;                          // deferred results of the group's async collectives
  std::vector<c10::intrusive_ptr<Work>> pending_;                // posted gloo sends and receives
  std::vector<std::pair<at::Tensor, at::Tensor>> pending_recvs_; // (xpu tensor, the bytes received for it)
};

// ---- c10d operators for the XPU dispatch key --------------------------------------------------------
// torch::distributed routes every collective through c10d::* operators with one kernel per device type
// (torch/csrc/distributed/c10d/Ops.cpp); a CPU build has none for XPU. These mirror that file for XPU:
// look up the group's xpu backend and call it.

using PG = c10::intrusive_ptr<c10d::ProcessGroup>;
using RedOp = c10::intrusive_ptr<c10d::ReduceOp>;
using WorkPtr = c10::intrusive_ptr<Work>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

c10::intrusive_ptr<c10d::Backend> xpu_backend(const PG& pg) { return pg->getBackend(c10::DeviceType::XPU); }
std::chrono::milliseconds ms(int64_t t) { return std::chrono::milliseconds(t); }

std::tuple<Tensors, WorkPtr> allreduce_(at::TensorList ts, const PG& pg, const RedOp& op,
                                        const std::optional<at::Tensor>& sparse, bool async_op, int64_t timeout) {
  auto v = ts.vec();
  c10d::AllreduceOptions o;
  o.reduceOp = *op;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  o.sparseIndices = sparse;
  auto w = xpu_backend(pg)->allreduce(v, o);
  return {v, w};
}

WorkPtr allreduce_coalesced_(at::TensorList ts, const PG& pg, const RedOp& op, bool async_op, int64_t timeout) {
  auto v = ts.vec();
  c10d::AllreduceCoalescedOptions o;
  o.reduceOp = *op;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  return xpu_backend(pg)->allreduce_coalesced(v, o);
}

WorkPtr reduce_(at::TensorList ts, const PG& pg, const RedOp& op, int64_t root, int64_t root_tensor, bool async_op,
                int64_t timeout) {
  auto v = ts.vec();
  c10d::ReduceOptions o;
  o.reduceOp = *op;
  o.rootRank = root;
  o.rootTensor = root_tensor;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  return xpu_backend(pg)->reduce(v, o);
}

std::tuple<Tensors, WorkPtr> broadcast_(at::TensorList ts, const PG& pg, int64_t root, int64_t root_tensor,
                                        bool async_op, int64_t timeout) {
  auto v = ts.vec();
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.rootTensor = root_tensor;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->broadcast(v, o);
  return {v, w};
}

std::tuple<TensorLists, WorkPtr> allgather_(const TensorLists& outs, at::TensorList ins, const PG& pg, bool async_op,
                                            int64_t timeout) {
  auto o_ = outs;
  auto i_ = ins.vec();
  c10d::AllgatherOptions o;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->allgather(o_, i_, o);
  return {o_, w};
}

std::tuple<at::Tensor, WorkPtr> allgather_base_(at::Tensor& out, at::Tensor& in, const PG& pg, bool async_op,
                                                int64_t timeout) {
  c10d::AllgatherOptions o;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->_allgather_base(out, in, o);
  return {out, w};
}

WorkPtr allgather_coalesced_(const TensorLists& outs, const at::TensorList& ins, const PG& pg, bool async_op) {
  auto o_ = outs;
  auto i_ = ins.vec();
  c10d::AllgatherOptions o;
  o.asyncOp = async_op;
  return xpu_backend(pg)->allgather_coalesced(o_, i_, o);
}

WorkPtr allgather_into_tensor_coalesced_(at::TensorList outs, at::TensorList ins, const PG& pg, bool async_op) {
  auto o_ = outs.vec();
  auto i_ = ins.vec();
  c10d::AllgatherOptions o;
  o.asyncOp = async_op;
  return xpu_backend(pg)->allgather_into_tensor_coalesced(o_, i_, o);
}

std::tuple<Tensors, WorkPtr> reduce_scatter_(const at::TensorList& outs, const TensorLists& ins, const PG& pg,
                                             const RedOp& op, bool async_op, int64_t timeout) {
  auto o_ = outs.vec();
  auto i_ = ins;
  c10d::ReduceScatterOptions o;
  o.reduceOp = *op;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->reduce_scatter(o_, i_, o);
  return {o_, w};
}

std::tuple<at::Tensor, WorkPtr> reduce_scatter_base_(at::Tensor& out, at::Tensor& in, const PG& pg, const RedOp& op,
                                                     bool async_op, int64_t timeout) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = *op;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->_reduce_scatter_base(out, in, o);
  return {out, w};
}

WorkPtr reduce_scatter_tensor_coalesced_(at::TensorList outs, at::TensorList ins, const PG& pg, const RedOp& op,
                                         bool async_op, int64_t timeout) {
  auto o_ = outs.vec();
  auto i_ = ins.vec();
  c10d::ReduceScatterOptions o;
  o.reduceOp = *op;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  return xpu_backend(pg)->reduce_scatter_tensor_coalesced(o_, i_, o);
}

WorkPtr gather_(const TensorLists& outs, const at::TensorList& ins, const PG& pg, int64_t root, bool async_op,
                int64_t timeout) {
  auto o_ = outs;
  auto i_ = ins.vec();
  c10d::GatherOptions o;
  o.rootRank = root;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  return xpu_backend(pg)->gather(o_, i_, o);
}

std::tuple<Tensors, WorkPtr> scatter_(const at::TensorList& outs, const TensorLists& ins, const PG& pg, int64_t root,
                                      bool async_op, int64_t timeout) {
  auto o_ = outs.vec();
  auto i_ = ins;
  c10d::ScatterOptions o;
  o.rootRank = root;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->scatter(o_, i_, o);
  return {o_, w};
}

std::tuple<Tensors, WorkPtr> alltoall_(const at::TensorList& outs, const at::TensorList& ins, const PG& pg,
                                       bool async_op, int64_t timeout) {
  auto o_ = outs.vec();
  auto i_ = ins.vec();
  c10d::AllToAllOptions o;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  auto w = xpu_backend(pg)->alltoall(o_, i_, o);
  return {o_, w};
}

WorkPtr alltoall_base_(at::Tensor& out, at::Tensor& in, const PG& pg, std::vector<int64_t> out_splits,
                       std::vector<int64_t> in_splits, bool async_op, int64_t timeout) {
  c10d::AllToAllOptions o;
  o.timeout = ms(timeout);
  o.asyncOp = async_op;
  return xpu_backend(pg)->alltoall_base(out, in, out_splits, in_splits, o);
}

WorkPtr barrier(at::Tensor t, const PG& pg, const std::vector<int64_t>& device_ids, bool async_op, int64_t timeout) {
  c10d::BarrierOptions o;
  o.device_ids = device_ids;
  o.timeout = ms(timeout);
  o.device = t.device();
  o.asyncOp = async_op;
  return xpu_backend(pg)->barrier(o);
}

WorkPtr send(at::TensorList ts, const PG& pg, int64_t dst, int64_t tag) {
  auto v = ts.vec();
  return xpu_backend(pg)->send(v, static_cast<int>(dst), static_cast<int>(tag));
}

WorkPtr recv_(at::TensorList ts, const PG& pg, int64_t src, int64_t tag) {
  auto v = ts.vec();
  return xpu_backend(pg)->recv(v, static_cast<int>(src), static_cast<int>(tag));
}

}  // namespace

TORCH_LIBRARY_IMPL(c10d, XPU, m) {
  m.impl("allreduce_", allreduce_);
  m.impl("allreduce_coalesced_", allreduce_coalesced_);
  m.impl("reduce_", reduce_);
  m.impl("broadcast_", broadcast_);
  m.impl("allgather_", allgather_);
  m.impl("_allgather_base_", allgather_base_);
  m.impl("allgather_coalesced_", allgather_coalesced_);
  m.impl("allgather_into_tensor_coalesced_", allgather_into_tensor_coalesced_);
  m.impl("reduce_scatter_", reduce_scatter_);
  m.impl("_reduce_scatter_base_", reduce_scatter_base_);
  m.impl("reduce_scatter_tensor_coalesced_", reduce_scatter_tensor_coalesced_);
  m.impl("gather_", gather_);
  m.impl("scatter_", scatter_);
  m.impl("alltoall_", alltoall_);
  m.impl("alltoall_base_", alltoall_base_);
  m.impl("barrier", barrier);
  m.impl("send", send);
  m.impl("recv_", recv_);
}

void xccl_set_torch_release(int major, int minor) {
  TORCH_CHECK(major == 2, "the emulated XCCL models torch 2.x releases, got ", major, ".", minor);
  torch_minor = minor;
}

void register_xccl(py::module& m) {
  py::class_<EmuXccl, c10d::Backend, c10::intrusive_ptr<EmuXccl>>(m, "XcclBackend")
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, int, int>(), py::arg("gloo"), py::arg("rank"), py::arg("size"));
}

}  // namespace xpu_emu
