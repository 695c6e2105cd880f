// Arrays: assembling blocks, host transfers, and resharding that moves only what must move.
#include "runtime/array.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "backends/process_comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/sharding_impl.h"
#include "runtime/detail/trace.h"

namespace meshrt {

using detail::cat;

namespace {

Shape starts(const Index& idx) {
  Shape s;
  for (auto& [a, b] : idx) s.push_back(a);
  return s;
}

Shape extents(const Index& idx) {
  Shape s;
  for (auto& [a, b] : idx) s.push_back(b - a);
  return s;
}

// The overlap of two boxes, or nullopt when empty.
std::optional<Index> intersect(const Index& a, const Index& b) {
  Index out;
  for (size_t d = 0; d < a.size(); ++d) {
    int64_t lo = std::max(a[d].first, b[d].first), hi = std::min(a[d].second, b[d].second);
    if (lo >= hi) return std::nullopt;
    out.emplace_back(lo, hi);
  }
  return out;
}

Shape offset_in(const Index& box, const Index& outer) {
  Shape s;
  for (size_t d = 0; d < box.size(); ++d) s.push_back(box[d].first - outer[d].first);
  return s;
}

}  // namespace

Array::Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks)
    : shape_(std::move(shape)),
      dtype_(dtype),
      sharding_(std::move(sharding)),
      blocks_(std::move(blocks)) {
  const auto& devs = sharding_.device_list();
  Shape block = detail::checked_shard_shape(sharding_, shape_, "array");
  if (blocks_.size() != devs.size()) {
    throw Error(cat("[array] ", blocks_.size(), " blocks given for a sharding over ", devs.size(),
                    " devices"));
  }
  for (size_t i = 0; i < devs.size(); ++i) {
    const Tensor& t = blocks_[i];
    if (!detail::is_local(devs[i])) {  // another process's device: its block lives there
      if (t.valid()) {
        throw Error(cat("[array] block ", i, " is given for ", devs[i].str(),
                        ", a device of another process; leave it empty (Tensor())"));
      }
      continue;
    }
    if (!t.valid() || t.device() != devs[i] || t.dtype() != dtype_ || t.shape() != block) {
      throw Error(cat("[array] block ", i, " is ", t.valid() ? t.str() : "empty", " but ",
                      sharding_.str(), " of ", dtype_name(dtype_), shape_str(shape_), " needs ",
                      dtype_name(dtype_), shape_str(block), " on ", devs[i].str()));
    }
  }
}

Array::Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks,
             std::vector<std::string> pending_sum_axes)
    : Array(std::move(shape), dtype, std::move(sharding), std::move(blocks)) {
  pending_sum_axes_ = std::move(pending_sum_axes);
  if (!pending_sum_axes_.empty()) sum_cache_ = std::make_shared<detail::SumCache>();
}

namespace detail {
namespace {
std::atomic<PendingSumResolver> g_resolver{nullptr};
}
void set_pending_sum_resolver(PendingSumResolver resolver) { g_resolver.store(resolver); }
struct SumCache {
  std::mutex mu;
  std::shared_ptr<const Array> sum;  // guarded by mu
  // Held in another layout (make_held_elsewhere): the value, and how to make the blocks when
  // something reads them; the blocks once made (guarded by blocks_mu).
  std::shared_ptr<const Array> elsewhere;
  std::function<std::vector<Tensor>()> make_blocks;
  // Not launched yet (make_deferred_launch): what make_blocks runs, until it has run.
  std::shared_ptr<const DeferredLaunch> launch;  // guarded by blocks_mu
  std::mutex blocks_mu;
  std::vector<Tensor> blocks;
  // Its own lock: the resolver, run under mu, reads it.
  std::mutex origin_mu;
  std::string origin;  // guarded by origin_mu
};

void set_pending_sum_origin(const Array& x, std::string origin) {
  if (!x.sum_cache_) return;
  std::lock_guard<std::mutex> lock(x.sum_cache_->origin_mu);
  x.sum_cache_->origin = std::move(origin);
}
std::string pending_sum_origin(const Array& x) {
  if (!x.sum_cache_) return {};
  std::lock_guard<std::mutex> lock(x.sum_cache_->origin_mu);
  return x.sum_cache_->origin;
}

Array make_held_elsewhere(Shape shape, DType dtype, Sharding sharding,
                          std::vector<std::string> pending_sum_axes, Array value,
                          std::function<std::vector<Tensor>()> make_blocks) {
  MESHRT_DCHECK(value.valid() && value.pending_sum_axes().empty());
  Array a;
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  a.sharding_ = std::move(sharding);
  a.pending_sum_axes_ = std::move(pending_sum_axes);
  a.sum_cache_ = std::make_shared<SumCache>();
  a.sum_cache_->elsewhere = std::make_shared<const Array>(std::move(value));
  a.sum_cache_->make_blocks = std::move(make_blocks);
  a.deferred_ = true;
  return a;
}

Array make_deferred_pending_sum(Shape shape, DType dtype, Sharding sharding,
                                std::vector<std::string> pending_sum_axes, Array value,
                                std::function<std::vector<Tensor>()> make_blocks) {
  MESHRT_DCHECK(!pending_sum_axes.empty());
  return make_held_elsewhere(std::move(shape), dtype, std::move(sharding),
                             std::move(pending_sum_axes), std::move(value), std::move(make_blocks));
}

Array make_kept_in_another_layout(Shape shape, DType dtype, Sharding sharding, Array value,
                                  std::function<std::vector<Tensor>()> make_blocks) {
  return make_held_elsewhere(std::move(shape), dtype, std::move(sharding), {}, std::move(value),
                             std::move(make_blocks));
}

Array make_deferred_launch(Shape shape, DType dtype, Sharding sharding,
                           std::shared_ptr<const DeferredLaunch> launch) {
  MESHRT_DCHECK(launch != nullptr);
  Array a;
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  a.sharding_ = std::move(sharding);
  a.sum_cache_ = std::make_shared<SumCache>();
  a.sum_cache_->make_blocks = [l = launch] { return l->run(); };
  a.sum_cache_->launch = std::move(launch);
  a.deferred_ = true;
  return a;
}

std::shared_ptr<const DeferredLaunch> pending_launch(const Array& x) {
  if (!x.deferred_) return nullptr;
  std::lock_guard<std::mutex> lock(x.sum_cache_->blocks_mu);
  return x.sum_cache_->launch;
}

const Array* value_elsewhere(const Array& x) {
  return x.deferred_ ? x.sum_cache_->elsewhere.get() : nullptr;
}

Array resolve_pending_sums(const Array& x) {
  if (x.pending_sum_axes().empty()) return x;
  PendingSumResolver r = g_resolver.load();
  if (r == nullptr) throw Error("[array] an Array with pending sums but no resolver installed");
  std::lock_guard<std::mutex> lock(x.sum_cache_->mu);
  if (!x.sum_cache_->sum) x.sum_cache_->sum = std::make_shared<const Array>(r(x));
  return *x.sum_cache_->sum;
}
}  // namespace detail

const std::vector<Tensor>& Array::deferred_blocks() const {
  detail::SumCache& c = *sum_cache_;
  std::lock_guard<std::mutex> lock(c.blocks_mu);
  if (c.blocks.empty()) {
    c.blocks = c.make_blocks();
    c.launch = nullptr;
    c.make_blocks = nullptr;  // what it held (operands, a launch) is no longer needed
  }
  return c.blocks;
}

Device Array::device() const {
  if (!valid()) throw Error("[array] device() of an empty (default-constructed) Array");
  const auto& devs = sharding_.device_list();
  if (devs.size() != 1) {
    throw Error(cat("[array] device() of an Array spread over ", devs.size(), " devices (",
                    sharding_.str(),
                    "); use sharding().device_list(), or device_put it onto one "
                    "device first"));
  }
  return devs.front();
}

Array device_put(const Tensor& x, const Sharding& to) {
  if (!x.valid()) throw Error("[device_put] an empty (default-constructed) Tensor");
  detail::check_host_read(x, "device_put");  // a traced Tensor would leave its trace here
  return device_put(
      detail::ArrayAccess::make(x.shape(), x.dtype(), SingleDeviceSharding(x.device()), {x}), to);
}

const Array& Array::block_until_ready() const {
  if (!valid()) {
    throw Error("[array] block_until_ready on an empty (default-constructed) Array");
  }
  if (!pending_sum_axes_.empty()) {
    detail::resolve_pending_sums(*this).block_until_ready();
    return *this;
  }
  // One platform per Array: where kernels complete before an op returns (cpu), nothing to wait
  // for and no per-block work (a timing loop of small ops calls this every iteration). blocks():
  // a value kept in another layout (make_kept_in_another_layout) is made here.
  const std::vector<Tensor>& held = blocks();
  const Tensor* first = nullptr;
  for (const Tensor& b : held) {
    if (b.valid()) {
      first = &b;
      break;
    }
  }
  if (first == nullptr || detail::backend_of(first->device()).host_addressable()) return *this;
  std::set<int> waited;  // device ids: replicated blocks on one device wait once
  for (const Tensor& b : held) {
    if (b.valid() && waited.insert(b.device().id()).second) b.block_until_ready();
  }
  return *this;
}

std::vector<Shard> Array::addressable_shards() const {
  if (!valid()) {
    throw Error("[array] addressable_shards of an empty (default-constructed) Array");
  }
  detail::check_host_read(*this, "addressable_shards");
  if (!pending_sum_axes_.empty()) return detail::resolve_pending_sums(*this).addressable_shards();
  std::vector<Index> idx = detail::indices(sharding_, shape_, "array");
  std::vector<Shard> out;
  const std::vector<Tensor>& held = blocks();  // made here for a value kept in another layout
  for (size_t i = 0; i < held.size(); ++i) {
    if (!held[i].valid()) continue;  // another process's device
    out.push_back(Shard{sharding_.device_list()[i], std::move(idx[i]), held[i]});
  }
  return out;
}

void Array::check_item() const {
  if (!valid()) throw Error("[array] item() of an empty (default-constructed) Array");
  if (size() != 1) {
    throw Error(cat("[array] item() needs an Array of exactly one element, but this ",
                    dtype_name(dtype_), shape_str(shape_), " Array has ", size(),
                    "; index it (x[i]) or reduce it (sum, mean) first"));
  }
}

std::string Array::str() const {
  if (!valid()) return "Array(empty)";
  std::string s =
      cat("Array(", dtype_name(dtype_), shape_str(shape_), ", sharding=", sharding_.str());
  if (!pending_sum_axes_.empty()) {
    s += cat(", pending sum over ", detail::names_tuple(pending_sum_axes_));
  }
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Array& x) {
  std::string s = x.str();
  if (x.valid() && x.size() <= detail::kMaxPrintedElements) {
    try {
      std::vector<char> host(static_cast<size_t>(x.size()) * dtype_size(x.dtype()));
      x.copy_to_host(host.data(), x.dtype());
      s.pop_back();  // the closing parenthesis
      s += cat(", values=", detail::values_str(host.data(), x.dtype(), x.shape()), ")");
    } catch (const Error&) {
      // Another process's value, or one traced inside jit: printed without its values.
    }
  }
  return os << s;
}

void Array::copy_to_host(void* dst, DType expected) const {
  if (!valid()) throw Error("[array] to_vector on an empty (default-constructed) Array");
  detail::check_host_read(*this, "to_vector");
  if (!pending_sum_axes_.empty()) {
    detail::resolve_pending_sums(*this).copy_to_host(dst, expected);
    return;
  }
  if (expected != dtype_) {
    throw Error(cat("[array] to_vector<", dtype_cpp_name(expected), "> called on a ",
                    dtype_name(dtype_), " array; use to_vector<", dtype_cpp_name(dtype_),
                    "> (or astype first)"));
  }
  std::vector<Index> idx = detail::indices(sharding_, shape_, "array");
  const std::vector<Tensor>& blocks = this->blocks();  // made here for a value kept elsewhere
  if (detail::process_layout().size > 1) {  // every box must have a holder in this process
    std::set<Index> held, remote;
    std::vector<std::string> where;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].valid()) held.insert(idx[i]);
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!held.count(idx[i]) && remote.insert(idx[i]).second)
        where.push_back(sharding_.device_list()[i].str());
    }
    if (!remote.empty()) {
      throw Error(
          cat("[array] to_vector of an Array that spans non-addressable devices: its shards on ",
              detail::join(where, ", ", [](const std::string& s) { return s; }),
              " belong to other processes (this is process ", detail::process_layout().rank,
              "); use process_allgather(x) to get the global value on every process, or "
              "addressable_shards() for this process's shards"));
    }
  }
  std::set<Index> done;  // replicated boxes come from the first local holder in mesh order
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i].valid() || !done.insert(idx[i]).second) continue;
    const Tensor& t = blocks[i];
    detail::copy_box({dst, shape_, starts(idx[i]), t.device(), true},
                     {t.data(), t.shape(), Shape(t.shape().size(), 0), t.device(), false},
                     t.shape(), dtype_size(dtype_));
  }
}

Array device_put(const void* data, int64_t count, DType dtype, Shape shape, const Sharding& to) {
  std::vector<Index> idx = detail::indices(to, shape, "device_put");
  if (count != shape_size(shape)) {
    throw Error(cat("[device_put] host data has ", count, " elements but shape ", shape_str(shape),
                    " needs ", shape_size(shape), "; pass exactly prod(shape) elements"));
  }
  Shape block = to.shard_shape(shape);
  std::vector<Tensor> blocks;
  const auto& devs = to.device_list();
  for (size_t i = 0; i < devs.size(); ++i) {
    if (!detail::is_local(devs[i])) {  // every process holds the host value: each copies its own
      blocks.emplace_back();
      continue;
    }
    Tensor t = empty(block, dtype, devs[i]);
    detail::copy_box({t.data(), block, Shape(block.size(), 0), devs[i], false},
                     {data, shape, starts(idx[i]), devs[i], true}, block, dtype_size(dtype));
    blocks.push_back(std::move(t));
  }
  return detail::ArrayAccess::make(std::move(shape), dtype, to, std::move(blocks));
}

namespace {
Array reshard_to(const Array& x, const Sharding& to);
}  // namespace

Array device_put(const Array& x, const Sharding& to) {
  detail::Traced<Array> tr(detail::OpId::device_put, {&x});
  return tr(reshard_to(x, to));
}

namespace {
Array reshard_to(const Array& x, const Sharding& to) {
  if (detail::ArrayAccess::blocks(x).empty())
    throw Error("[device_put] resharding an empty (default-constructed) Array");
  if (!x.pending_sum_axes().empty()) return reshard_to(detail::resolve_pending_sums(x), to);
  const Shape& shape = x.shape();
  std::vector<Index> dst_idx = detail::indices(to, shape, "device_put");
  std::vector<Index> src_idx = detail::indices(x.sharding(), shape, "device_put");
  const auto& src_devs = x.sharding().device_list();
  // Distinct source boxes (they tile the array) and the devices holding each, in mesh order.
  std::map<Index, std::vector<size_t>> holders;
  for (size_t i = 0; i < src_idx.size(); ++i) holders[src_idx[i]].push_back(i);

  Shape block = to.shard_shape(shape);
  const size_t elem = dtype_size(x.dtype());
  // Ranges held only by another process's devices cross by message: every process walks the same
  // plan in the same order, so the n-th crossing has tag n on both sides.
  struct Incoming {
    size_t block;
    Shape at, extent;
    std::vector<char> data;
  };
  std::vector<Incoming> incoming;
  std::vector<std::vector<char>> outgoing;
  std::vector<backend::ProcessComm::Transfer> sends, recvs;
  int64_t tag = 0;
  std::vector<Tensor> blocks;
  // Copies between this process's devices go out as one batch (a device platform orders and
  // launches it once); the destinations are fresh blocks, so none overlaps another copy.
  detail::CopyBatch local_copies;
  const auto& devs = to.device_list();
  for (size_t j = 0; j < devs.size(); ++j) {
    const Device dev = devs[j];
    const bool mine = detail::is_local(dev);
    // Already held by this device: share the block, move nothing.
    auto same = holders.find(dst_idx[j]);
    if (mine && same != holders.end()) {
      bool reused = false;
      for (size_t i : same->second) {
        if (src_devs[i] == dev) {
          blocks.push_back(detail::ArrayAccess::blocks(x)[i]);
          reused = true;
          break;
        }
      }
      if (reused) continue;
    }
    Tensor t = mine ? empty(block, x.dtype(), dev) : Tensor();
    for (auto& [box, who] : holders) {
      std::optional<Index> part = intersect(box, dst_idx[j]);
      if (!part) continue;
      // A local copy beats a transfer; a holder in the destination's process beats a message.
      size_t from = who.front();
      bool same_process = false;
      for (size_t i : who) {
        if (src_devs[i] == dev) {
          from = i;
          same_process = true;
          break;
        }
        if (!same_process && src_devs[i].process_index() == dev.process_index()) {
          from = i;
          same_process = true;
        }
      }
      const Device src_dev = src_devs[from];
      if (src_dev.process_index() == dev.process_index()) {
        if (!mine) continue;
        const Tensor& s = detail::ArrayAccess::blocks(x)[from];
        local_copies.add({t.data(), block, offset_in(*part, dst_idx[j]), dev, false},
                         {s.data(), s.shape(), offset_in(*part, box), s.device(), false},
                         extents(*part), elem);
        continue;
      }
      // Messages with one tag match in posting order, which both sides share: tags may wrap.
      // 64-bit: MPI_TAG_UB may be INT_MAX (Open MPI), and INT_MAX + 1 overflows an int.
      const int this_tag =
          static_cast<int>(tag++ % (int64_t{backend::process_comm()->max_tag()} + 1));
      const Shape ext = extents(*part);
      const auto bytes = static_cast<int64_t>(static_cast<size_t>(shape_size(ext)) * elem);
      if (mine) {
        incoming.push_back(
            {j, offset_in(*part, dst_idx[j]), ext, std::vector<char>(static_cast<size_t>(bytes))});
        recvs.push_back({src_dev.process_index(), this_tag, nullptr, bytes});
      } else if (detail::is_local(src_dev)) {
        const Tensor& s = detail::ArrayAccess::blocks(x)[from];
        std::vector<char> buf(static_cast<size_t>(bytes));
        detail::copy_box({buf.data(), ext, Shape(ext.size(), 0), src_dev, true},
                         {s.data(), s.shape(), offset_in(*part, box), s.device(), false}, ext,
                         elem);
        outgoing.push_back(std::move(buf));
        sends.push_back({dev.process_index(), this_tag, outgoing.back().data(), bytes});
      }
    }
    blocks.push_back(std::move(t));
  }
  local_copies.flush();
  if (!sends.empty() || !recvs.empty()) {
    for (size_t k = 0; k < recvs.size(); ++k) recvs[k].data = incoming[k].data.data();
    backend::ProcessComm* comm = backend::process_comm();
    const std::string what =
        cat("device_put of ", dtype_name(x.dtype()), shape_str(shape), " onto ", to.str());
    std::vector<int> missing = comm->send_recv(
        sends, recvs, std::chrono::steady_clock::now() + config::collective_timeout(), what);
    if (!missing.empty()) {
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      const std::string msg =
          cat("[device_put] ", what,
              " timed out after MESHRT_COLLECTIVE_TIMEOUT waiting for process(es) ",
              detail::join(missing, ", ", [](int r) { return cat(r); }),
              "; every process must make the same device_put calls in the same order");
      comm->mark_broken(msg);
      throw Error(msg);
    }
    for (Incoming& in : incoming) {
      Tensor& t = blocks[in.block];
      detail::copy_box({t.data(), block, in.at, t.device(), false},
                       {in.data.data(), in.extent, Shape(in.extent.size(), 0), t.device(), true},
                       in.extent, elem);
    }
  }
  return detail::ArrayAccess::make(shape, x.dtype(), to, std::move(blocks));
}
}  // namespace

void detail::clear_trace_id(Array& x) { detail::set_trace_id(x, 0); }

}  // namespace meshrt
