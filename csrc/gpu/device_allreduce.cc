// Allreduce of GPU memory among the ranks of one host, through CUDA IPC.
//
// Set-up (first use): each rank allocates its buffer, the ranks exchange the
// IPC handles over the group's links and map each other's, then agree that
// everyone succeeded. If any rank could not (no peer access between two
// GPUs, out of memory), the group stages through pinned host memory from
// then on, and says why once.
//
// Each piece of the buffer (at most the group's smallest shared buffer) then
// takes three phases with a barrier after each:
//  1. every rank copies its piece into its shared buffer;
//  2. rank r combines chunk r of the piece from every rank's buffer into its
//     own output, then publishes the result in its buffer;
//  3. every rank copies the other chunks from their owners' buffers.
// The last barrier keeps the next piece from overwriting a buffer that a
// peer still reads; the first piece's first barrier is the exchange of op
// headers. Only control messages cross the host links.
//
// Each element is combined in the order the host path (allreduce.cc) would
// combine it: rank order up to oneRoundAllreduce, otherwise along the ring
// starting after the owner of the element's chunk. So the results are bit for
// bit those of the CPU path, and the same on every rank.
#ifdef RINGDIST_CUDA

#include "csrc/gpu/device_allreduce.h"

#include <algorithm>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/gpu/cuda/reduce.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

namespace {

// The chunk of the whole buffer (ring layout) that element `index` is in.
size_t chunkOf(const ChunkLayout& layout, size_t index) {
  const size_t longChunks = layout.extra * (layout.base + 1);
  if (index < longChunks) return index / (layout.base + 1);
  return layout.extra + (index - longChunks) / layout.base;
}

// Ranks in the order their contributions to a chunk are combined.
std::vector<int> combineOrder(const Communicator& comm, bool small, size_t chunk) {
  const int n = comm.size();
  std::vector<int> order;
  for (int k = 1; k <= n; ++k) {
    order.push_back(small ? k - 1 : comm.ringRank(static_cast<int>(chunk) + k));
  }
  return order;
}

}  // namespace

DeviceAllreduce::DeviceAllreduce(int device, size_t bufferBytes)
    : device_(device), bufferBytes_(bufferBytes), waiter_(device) {}

DeviceAllreduce::~DeviceAllreduce() {
  if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
}

void DeviceAllreduce::run(Communicator& comm, void* data, size_t count, DataType dtype,
                          ReduceOp op, cudaStream_t stream) {
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  OpHeader header = comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1);
  header.variant = kDeviceAllreduce;
  // Set-up is collective itself: a rank running another operation fails its
  // exchange with a clear error.
  if (count > 0 && state_ == State::kNew) setUp(comm);
  char* bytes = static_cast<char*>(data);
  if (count == 0 || state_ == State::kUnusable) {
    comm.exchangeHeaders(header, comm.others(), comm.others());
    if (count > 0) runStaged(comm, bytes, count, dtype, op, stream);
  } else {
    const size_t pieceElems = std::max<size_t>(1, pieceBytes_ / elementSize(dtype));
    for (size_t offset = 0; offset < count; offset += pieceElems) {
      runPiece(comm, bytes, offset, std::min(pieceElems, count - offset), count, dtype, op,
               stream, offset == 0 ? &header : nullptr);
    }
  }
  if (comm.options().checkResults) {
    const size_t total = count * elementSize(dtype);
    std::vector<char> host(total);
    cuda::copyAsync(host.data(), data, total, stream);  // pageable: synchronous to the host
    waitFor(comm, stream, "copy the result for the result check");
    checkIdenticalResults(comm, host.data(), total, "allreduce");
  }
}

void DeviceAllreduce::setUp(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  std::string problem;
  cuda::BufferRecord mine{};
  mine.bytes = bufferBytes_;
  try {
    mine_ = std::make_unique<cuda::SharedBuffer>(device_, bufferBytes_);
    mine = mine_->record();
  } catch (const Error& e) {
    problem = e.what();
  }
  const std::vector<cuda::BufferRecord> records = allgatherValue(comm, mine);
  pieceBytes_ = bufferBytes_;
  mapped_.resize(static_cast<size_t>(n));
  buffers_.assign(static_cast<size_t>(n), nullptr);
  for (int r = 0; r < n; ++r) {
    const auto& record = records[static_cast<size_t>(r)];
    pieceBytes_ = std::min<size_t>(pieceBytes_, record.bytes);
    if (r == me || !problem.empty()) continue;
    if (record.valid == 0) {
      problem = strCat("rank ", r, " could not allocate its buffer");
      continue;
    }
    try {
      mapped_[static_cast<size_t>(r)] = std::make_unique<cuda::MappedBuffer>(device_, record);
      buffers_[static_cast<size_t>(r)] = static_cast<char*>(mapped_[static_cast<size_t>(r)]->data());
    } catch (const Error& e) {
      problem = strCat("mapping rank ", r, "'s buffer: ", e.what());
    }
  }
  pieceBytes_ = pieceBytes_ / 256 * 256;
  if (everyRank(comm, problem.empty() && pieceBytes_ > 0)) {
    buffers_[static_cast<size_t>(me)] = static_cast<char*>(mine_->data());
    state_ = State::kReady;
    return;
  }
  mapped_.clear();
  buffers_.clear();
  mine_.reset();
  state_ = State::kUnusable;
  logWarning(strCat("ringdist: rank ", me, ": CUDA allreduce between the ranks of this host "
                    "cannot share GPU memory (", problem.empty() ? "another rank could not" : problem,
                    "); it goes through pinned host memory instead"));
}

void DeviceAllreduce::runPiece(Communicator& comm, char* data, size_t offset, size_t length,
                               size_t count, DataType dtype, ReduceOp op, cudaStream_t stream,
                               const OpHeader* header) {
  const int n = comm.size();
  const size_t me = static_cast<size_t>(comm.rank());
  const size_t elem = elementSize(dtype);
  char* piece = data + offset * elem;

  cuda::copyAsync(buffers_[me], piece, length * elem, stream);
  waitFor(comm, stream, "copy the input into the buffer shared with the other ranks");
  if (header != nullptr) {  // the first barrier also checks that all ranks agree
    comm.exchangeHeaders(*header, comm.others(), comm.others());
  } else {
    barrier(comm);
  }

  const ChunkLayout parts(length, n, elem, elem);
  const ChunkLayout whole(count, n, elem, elem);
  const bool small = comm.options().oneRoundAllreduce(count * elem, n);
  const size_t ownBegin = parts.chunkOffset(me);
  const size_t ownEnd = ownBegin + parts.chunkLength(me);
  for (size_t begin = ownBegin; begin < ownEnd;) {
    // Split where the whole buffer's chunks (and so the combine order) change.
    const size_t chunk = chunkOf(whole, offset + begin);
    const size_t end = small ? ownEnd
                             : std::min(ownEnd, whole.chunkOffset(chunk) + whole.chunkLength(chunk) -
                                                    offset);
    const std::vector<int> order = combineOrder(comm, small, chunk);
    const size_t at = begin * elem;
    char* dst = piece + at;
    cuda::reduce(dtype, op, dst, buffers_[static_cast<size_t>(order[0])] + at,
                 buffers_[static_cast<size_t>(order[1])] + at, end - begin, stream);
    for (int k = 2; k < n; ++k) {
      cuda::reduce(dtype, op, dst, dst, buffers_[static_cast<size_t>(order[static_cast<size_t>(k)])] + at,
                   end - begin, stream);
    }
    begin = end;
  }
  if (op == ReduceOp::kAvg) {
    cuda::divide(dtype, piece + ownBegin * elem, ownEnd - ownBegin, n, stream);
  }
  cuda::copyAsync(buffers_[me] + ownBegin * elem, piece + ownBegin * elem,
                  (ownEnd - ownBegin) * elem, stream);
  waitFor(comm, stream, "combine this rank's chunk");
  barrier(comm);

  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    if (r != me) {
      cuda::copyAsync(piece + parts.chunkOffset(r) * elem, buffers_[r] + parts.chunkOffset(r) * elem,
                      parts.chunkLength(r) * elem, stream);
    }
  }
  waitFor(comm, stream, "copy the other ranks' chunks");
  barrier(comm);
}

// The whole buffer at once, like the staged path of other collectives, so the
// results stay those of the CPU path.
void DeviceAllreduce::runStaged(Communicator& comm, char* data, size_t count, DataType dtype,
                                ReduceOp op, cudaStream_t stream) {
  const size_t bytes = count * elementSize(dtype);
  if (pinnedBytes_ < bytes) {
    if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinnedBytes_ = 0;
    cudaError_t err = cudaMallocHost(&pinned_, bytes);
    RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda: cudaMallocHost: ", cudaGetErrorString(err));
    pinnedBytes_ = bytes;
  }
  cuda::copyAsync(pinned_, data, bytes, stream);
  waitFor(comm, stream, "copy the input to host memory");
  allreduce(comm, pinned_, count, dtype, op);
  cuda::copyAsync(data, pinned_, bytes, stream);
  waitFor(comm, stream, "copy the result back to the GPU");
}

void DeviceAllreduce::waitFor(Communicator& comm, cudaStream_t stream, const char* what) {
  waiter_.wait(stream, comm.deadline(), what);
}

}  // namespace ringdist

#endif  // RINGDIST_CUDA
