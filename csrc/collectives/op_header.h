#pragma once

// The operation header: what every operation sends ahead of its data to each
// peer it talks to (or publishes on the board), and the check of a peer's
// header against ours.

#include <cstdint>

namespace ringdist {

// Kinds of operation; travel in op headers (append only).
enum class OpType : uint8_t {
  kAllreduce = 1,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kReduce,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kSend,
  kCompressedAllreduce,
};

const char* opTypeName(OpType type);

// Sent ahead of every operation's data to each peer it talks to, so ranks
// that disagree on the operation, its size or dtype fail with a clear error
// instead of reading each other's bytes as data. Every field is compared.
struct OpHeader {
  uint32_t magic;
  uint8_t type;          // OpType
  uint8_t dtype;         // DataType
  uint8_t op;            // ReduceOp (reductions; else SUM)
  uint8_t variant;       // allreduce: its algorithm; compressed allreduce: its codec
  uint64_t seq;          // collective sequence number in this group (0 for sends)
  uint64_t count;        // elements (all-to-all: to this peer; send: bytes)
  int32_t root;          // rooted collectives, else -1
  uint32_t segmentBytes; // collectives: how buffers are cut into segments
  int32_t tag;           // send: the message tag
  uint32_t padding;      // 0: keeps the header a multiple of 8 bytes
};
static_assert(sizeof(OpHeader) == 40, "OpHeader is a wire format");
constexpr uint32_t kOpMagic = 0x52444f50;  // "RDOP", first field of every header

// Throws, naming both calls, if `theirs` (from rank `peer`) differs from
// `expected`; `rank` and `opName` are ours, for the message.
void checkOpHeader(const OpHeader& expected, const OpHeader& theirs, int rank, int peer,
                   const char* opName);

}  // namespace ringdist
