#include "csrc/collectives/op_header.h"

#include <string>

#include "csrc/codec/codec.h"
#include "csrc/common/error.h"
#include "csrc/common/types.h"

namespace ringdist {

namespace {

std::string describeHeader(const OpHeader& h) {
  std::string text = strCat(opTypeName(static_cast<OpType>(h.type)), "(seq=", h.seq,
                            ", count=", h.count, ", dtype=",
                            dataTypeName(static_cast<DataType>(h.dtype)));
  auto type = static_cast<OpType>(h.type);
  if (type == OpType::kAllreduce || type == OpType::kReduceScatter || type == OpType::kReduce) {
    text += strCat(", op=", reduceOpName(static_cast<ReduceOp>(h.op)));
  }
  if (type == OpType::kCompressedAllreduce) {
    text += strCat(", op=", reduceOpName(static_cast<ReduceOp>(h.op)), ", codec=",
                   isKnownCodec(h.variant) ? codecName(static_cast<Codec>(h.variant)) : "?");
  }
  if (type == OpType::kAllreduce) {  // AllreduceVariant (collectives.h)
    static const char* kAlgorithms[] = {"ring", "one round", "two-level", "GPU to GPU",
                                        "single copy"};
    text += strCat(", algorithm=", h.variant < 5 ? kAlgorithms[h.variant] : "?");
  }
  if (type == OpType::kBroadcast || type == OpType::kAllgather ||
      type == OpType::kReduceScatter) {  // CopyVariant
    text += h.variant == 1 ? ", single copy" : ", through the links";
  }
  if (h.root >= 0) {
    text += strCat(", root=", h.root);
  }
  text += type == OpType::kSend ? strCat(", tag=", h.tag) : strCat(", segment_bytes=", h.segmentBytes);
  return text + ")";
}

}  // namespace

const char* opTypeName(OpType type) {
  switch (type) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllgather: return "allgather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kReduce: return "reduce";
    case OpType::kGather: return "gather";
    case OpType::kScatter: return "scatter";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send/recv";
    case OpType::kCompressedAllreduce: return "compressed_allreduce";
  }
  return "unknown";
}

void checkOpHeader(const OpHeader& expected, const OpHeader& theirs, int rank, int peer,
                   const char* opName) {
  RINGDIST_CHECK(theirs.magic == kOpMagic, "ringdist ", opName, ": rank ", rank,
                 " received a corrupt operation header from rank ", peer,
                 " (the ranks are out of step)");
  bool same = theirs.type == expected.type && theirs.dtype == expected.dtype &&
      theirs.op == expected.op && theirs.seq == expected.seq && theirs.count == expected.count &&
      theirs.root == expected.root && theirs.segmentBytes == expected.segmentBytes &&
      theirs.tag == expected.tag && theirs.variant == expected.variant &&
      theirs.padding == expected.padding;
  if (same) {
    return;
  }
  if (theirs.type == expected.type && theirs.seq == expected.seq &&
      static_cast<OpType>(expected.type) == OpType::kAlltoall && theirs.count != expected.count) {
    RINGDIST_FAIL("ringdist ", opName, ": rank ", rank, " expects ", expected.count,
                  " elements from rank ", peer, " but rank ", peer, " sends ", theirs.count);
  }
  RINGDIST_FAIL("ringdist ", opName, ": ranks disagree: rank ", rank, " called ",
                describeHeader(expected), " but rank ", peer, " called ", describeHeader(theirs));
}

}  // namespace ringdist
