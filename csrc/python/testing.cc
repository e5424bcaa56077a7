#include "csrc/python/testing.h"

#include "csrc/backend/testing.h"
#include "csrc/common/cpu.h"

namespace py = pybind11;

namespace ringdist {

void defineTestingModule(py::module_& parent) {
  using namespace testing;
  py::module_ m = parent.def_submodule(
      "testing", "CPU kernels and the element arithmetic they share with the CUDA kernels");
  m.def("reduce_kernel", &reduceWithKernel, py::arg("a"), py::arg("b"), py::arg("op"),
        "a (op) b with the CPU reduce kernel the collectives use");
  m.def("reduce_shared", &reduceWithShared, py::arg("a"), py::arg("b"), py::arg("op"),
        "a (op) b one element at a time through the arithmetic shared with the CUDA kernels");
  m.def("narrow", &narrow, py::arg("values"), py::arg("to"), py::arg("shared"),
        "float32 -> fp16/bf16 bits (int16): CPU kernel conversion, or the shared one");
  m.def("widen", &widen, py::arg("bits"), py::arg("from_"), py::arg("shared"),
        "fp16/bf16 bits (int16) -> float32: CPU kernel conversion, or the shared one");
  m.def("divide_kernel", &divideWithKernel, py::arg("x"), py::arg("divisor"),
        "x / divisor with the CPU kernel that finalises AVG");
  m.def("cuda_reduce", &reduceWithCudaKernel, py::arg("a"), py::arg("b"), py::arg("op"),
        "a (op) b with the GPU reduce kernel, on the current stream (CUDA builds only)");
  m.def("codec_encode", &codecEncode, py::arg("values"), py::arg("codec"), py::arg("impl"),
        "Encoded bytes (uint8) of float32 values: impl 'cpu', 'shared' or 'cuda'");
  m.def("codec_decode", &codecDecode, py::arg("bytes"), py::arg("codec"), py::arg("count"),
        py::arg("impl"), py::arg("acc") = py::none(),
        "Decoded float32 values (added to a copy of acc if given): impl 'cpu', 'shared' or 'cuda'");
  m.def("topk_radix_select", &topkRadixSelect, py::arg("grad"), py::arg("residual"), py::arg("k"),
        py::arg("packed"), py::arg("tile"),
        "topk_select computed as the GPU kernels compute it (radix select, tiles of `tile` "
        "entries), on the host through the shared arithmetic");
  m.def("ring_forward_lag", &ringForwardLag, py::arg("round_trip_us"), py::arg("segment_bytes"),
        "How many segments the ring allreduce forwards a segment after its arrival, on links "
        "of this round trip (forwardLag in csrc/collectives/ring.h)");
  m.def("copy_bytes", &copyBytesWithin, py::arg("buffer"), py::arg("to"), py::arg("from_"),
        py::arg("bytes"),
        "The engine's large copy (copyBytes, in pieces), from offset from_ to offset to of a "
        "uint8 tensor, in place; the regions may overlap");
  m.def("cuda_divide", &divideWithCudaKernel, py::arg("x"), py::arg("divisor"),
        "x / divisor with the GPU kernel that finalises AVG (CUDA builds only)");
  m.def("same_gpu_host_run", &sameGpuHostRun, py::arg("group_name"), py::arg("kind"),
        py::arg("input"), py::arg("output"), py::arg("op") = "sum", py::arg("root") = 0,
        py::arg("offset") = 0, py::arg("lend") = true, py::arg("renew") = false,
        py::arg("stall") = false, py::arg("vanish") = false, py::arg("device") = 0,
        py::arg("peer_access") = false, py::arg("timeout_ms") = 30000,
        py::arg("sends") = std::vector<int64_t>{}, py::arg("receipts") = std::vector<int64_t>{},
        "One collective through the same-GPU protocol run on the CPU (host streams, "
        "shared-memory arenas for IPC): fused (0: the engine ran it), seq, opens, cached");
  m.def("gated", &gated, py::arg("group_name"), py::arg("collective"), py::arg("input"),
        py::arg("output"), py::arg("op") = "sum", py::arg("piece_bytes") = 2 << 20,
        py::arg("delay_us") = 0, py::arg("timeout_ms") = 30000,
        "allreduce, all_gather (into one tensor) or reduce_scatter (from one tensor) through a "
        "StageGate run on the CPU, in the CUDA twins' pieces (the pipelined staging of CUDA "
        "tensors across hosts): planned, pieces, needs, produced, copies_back, produced_early, "
        "bytes_planned_once, bytes_produced_once");
  m.def("same_gpu_host_messages", &sameGpuHostMessages, py::arg("group_name"), py::arg("sends"),
        py::arg("send_peers"), py::arg("send_tags"), py::arg("receives"),
        py::arg("receive_sources"), py::arg("receive_tags"), py::arg("device") = 0,
        py::arg("peer_access") = false, py::arg("timeout_ms") = 30000,
        "Point-to-point GPU messages through the same-GPU protocol run on the CPU: sends, an "
        "exchange of their records, then receives in order; waiting_senders, message_opens");
  m.def("p2p_device_message", &p2pDeviceMessage, py::arg("group_name"), py::arg("send"),
        py::arg("peer"), py::arg("tag"), py::arg("bytes"), py::arg("index") = 0,
        py::arg("takes_device") = true,
        "One send of a device message (a DeviceMessage numbered index), or one receive that "
        "takes one (or only bytes): device, index, source");
  m.def("same_gpu_host_reset", &sameGpuHostReset, py::arg("group_name"),
        "Drop that group's same-GPU test state (streams, watch, mappings)");
  m.def("select_kernel_family", &selectKernelFamily, py::arg("name"),
        "Run the CPU kernels of family `name` from now on, in this process ('generic', or this "
        "CPU's vector family: 'avx2' or 'neon'); False if this CPU cannot. For tests and "
        "benchmarks: call it before kernels run on other threads");
}

}  // namespace ringdist
