// Python bindings: the backend class (so Python can tune it) and the
// creator that torch_ringdist registers with torch.distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/headeronly/version.h>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/process_group.h"
#include "csrc/backend/testing.h"
#include "csrc/codec/codec.h"
#include "csrc/common/cpu.h"
#include "csrc/hooks/topk.h"
#include "csrc/transport/mesh.h"
#ifdef RINGDIST_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "csrc/cuda/codec.h"
#include "csrc/cuda/topk.h"
#endif

namespace py = pybind11;

namespace {

constexpr bool cudaCompiled() {
#ifdef RINGDIST_CUDA
  return true;
#else
  return false;
#endif
}

#ifdef RINGDIST_CUDA
// The GPU round trip, queued on the current stream: the same encode/decode
// as the wire path (csrc/cuda/codec.h), so the residual is exactly what the
// compressed allreduce loses.
void cudaRoundTrip(ringdist::Codec codec, const at::Tensor& in, at::Tensor& result,
                   bool residual) {
  const size_t count = static_cast<size_t>(in.numel());
  if (count == 0) {
    return;
  }
  c10::cuda::CUDAGuard guard(in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(in.device().index()).stream();
  at::Tensor wire = at::empty({static_cast<int64_t>(ringdist::encodedBytes(codec, count))},
                              in.options().dtype(at::kByte));
  ringdist::cuda::encode(codec, in.data_ptr<float>(), count, wire.data_ptr(), stream);
  ringdist::cuda::decode(codec, wire.data_ptr(), count, result.data_ptr<float>(), stream);
  if (residual) {
    at::sub_out(result, in, result);  // one IEEE subtraction per element, as on the CPU
  }
}
#endif

at::Tensor codecRoundTrip(const at::Tensor& tensor, const std::string& name,
                          std::optional<at::Tensor> out, bool residual) {
  ringdist::Codec codec = ringdist::parseCodec(name);
  TORCH_CHECK((tensor.device().is_cpu() || (tensor.is_cuda() && cudaCompiled())) &&
                  tensor.layout() == at::kStrided && tensor.scalar_type() == at::kFloat,
              "ringdist codec_roundtrip: expected a dense float32 CPU",
              cudaCompiled() ? " or CUDA" : "", " tensor, got ", tensor.scalar_type(), " on ",
              tensor.device());
  at::Tensor in = tensor.contiguous();
  at::Tensor result = out.has_value() ? *out : at::empty_like(in);
  TORCH_CHECK(result.scalar_type() == at::kFloat && result.is_contiguous() &&
                  result.numel() == in.numel() && result.device() == in.device(),
              "ringdist codec_roundtrip: out must be a contiguous float32 tensor of ",
              in.numel(), " elements on ", in.device());
#ifdef RINGDIST_CUDA
  if (in.is_cuda()) {
    cudaRoundTrip(codec, in, result, residual);
    return result;
  }
#endif
  {
    py::gil_scoped_release release;
    if (residual) {
      ringdist::roundTripError(codec, in.data_ptr<float>(), static_cast<size_t>(in.numel()),
                               result.data_ptr<float>());
    } else {
      ringdist::roundTrip(codec, in.data_ptr<float>(), static_cast<size_t>(in.numel()),
                          result.data_ptr<float>());
    }
  }
  return result;
}

// The top-k kernels' operands: contiguous float32 tensors on one device, the
// CPU or (CUDA builds) a GPU.
void checkTopkOperand(const char* what, const at::Tensor& t, const char* name,
                      const at::Device& device) {
  TORCH_CHECK(t.device() == device && t.layout() == at::kStrided &&
                  t.scalar_type() == at::kFloat && t.is_contiguous(),
              "ringdist ", what, ": ", name, " must be a contiguous float32 tensor on ", device,
              ", got ", t.scalar_type(), " on ", t.device());
}

at::Device topkDevice(const char* what, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() || (t.is_cuda() && cudaCompiled()), "ringdist ", what,
              ": expected tensors on the CPU", cudaCompiled() ? " or a GPU" : "", ", got ",
              t.device(), cudaCompiled() ? "" : " (this build of ringdist has no CUDA kernels)");
  return t.device();
}

void topkSelect(const at::Tensor& grad, std::optional<at::Tensor> residual, int64_t k,
                at::Tensor& packed) {
  const char* what = "topk_select";
  const at::Device device = topkDevice(what, grad);
  checkTopkOperand(what, grad, "grad", device);
  checkTopkOperand(what, packed, "packed", device);
  const int64_t n = grad.numel();
  TORCH_CHECK(k >= 0 && k <= n && packed.numel() == 2 * k, "ringdist topk_select: k = ", k,
              " of ", n, " entries with packed of ", packed.numel(), " (want 2k)");
  float* res = nullptr;
  if (residual.has_value()) {
    checkTopkOperand(what, *residual, "residual", device);
    TORCH_CHECK(residual->numel() == n, "ringdist topk_select: residual has ", residual->numel(),
                " entries, grad ", n);
    res = residual->data_ptr<float>();
  }
  float* values = packed.data_ptr<float>();
  auto* indices = reinterpret_cast<int32_t*>(values + k);
#ifdef RINGDIST_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    at::Tensor workspace = at::empty(
        {static_cast<int64_t>(ringdist::cuda::topkSelectWorkspaceBytes(static_cast<size_t>(n)))},
        grad.options().dtype(at::kByte));
    ringdist::cuda::topkSelect(grad.data_ptr<float>(), res, static_cast<size_t>(n),
                               static_cast<size_t>(k), values, indices, workspace.data_ptr(),
                               c10::cuda::getCurrentCUDAStream(device.index()).stream());
    return;
  }
#endif
  py::gil_scoped_release release;
  ringdist::topkSelect(grad.data_ptr<float>(), res, static_cast<size_t>(n),
                       static_cast<size_t>(k), values, indices);
}

void topkScatter(const at::Tensor& parts, int64_t world, int64_t k, at::Tensor& out) {
  const char* what = "topk_scatter";
  const at::Device device = topkDevice(what, out);
  checkTopkOperand(what, parts, "parts", device);
  checkTopkOperand(what, out, "out", device);
  TORCH_CHECK(world >= 1 && k >= 0 && parts.numel() == 2 * k * world,
              "ringdist topk_scatter: parts has ", parts.numel(), " entries, want 2 x k (", k,
              ") x world (", world, ")");
#ifdef RINGDIST_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    at::Tensor flag = at::empty({8}, out.options().dtype(at::kByte));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    py::gil_scoped_release release;  // it waits for the GPU to check the indices
    ringdist::cuda::topkScatter(parts.data_ptr<float>(), static_cast<size_t>(world),
                                static_cast<size_t>(k), static_cast<size_t>(out.numel()),
                                out.data_ptr<float>(), flag.data_ptr(), stream);
    return;
  }
#endif
  py::gil_scoped_release release;
  ringdist::topkScatter(parts.data_ptr<float>(), static_cast<size_t>(world),
                        static_cast<size_t>(k), static_cast<size_t>(out.numel()),
                        out.data_ptr<float>());
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringdist: a ring-allreduce torch.distributed backend";
  // torch registers c10d::Backend with an intrusive_ptr holder; ours matches.
  py::module_::import("torch._C._distributed_c10d");
  py::class_<ringdist::ProcessGroupRingdist, c10d::Backend,
             c10::intrusive_ptr<ringdist::ProcessGroupRingdist>>(m, "ProcessGroupRingdist")
      .def_property("segment_bytes", &ringdist::ProcessGroupRingdist::segmentBytes,
                    // The setter waits for the worker thread, which may need the
                    // GIL to free a tensor: release it while waiting.
                    py::cpp_function(&ringdist::ProcessGroupRingdist::setSegmentBytes,
                                     py::call_guard<py::gil_scoped_release>()),
                    "Bytes per pipelined segment; every rank of the group must use the same value")
      .def_property_readonly("transports", &ringdist::ProcessGroupRingdist::transports,
                             "Transport used to reach each rank: 'tcp', 'shm' or 'self'")
      .def_property_readonly("same_host_copy", [](const ringdist::ProcessGroupRingdist& pg) {
             const auto& copy = pg.sameHostCopy();
             py::dict out;
             out["single_copy"] = copy.singleCopy;
             out["why"] = copy.why;
             out["probe_kernel_us"] = copy.kernelCopyUs;
             out["probe_rings_us"] = copy.ringCopyUs;
             return out;
           },
           "How this host's ranks copy large buffers between them: single_copy (straight "
           "between buffers) or the shared-memory rings, why, and the connect-time probe's "
           "figures (us, summed over the host's ranks; 0 when not measured)")
      .def_property_readonly("allreduce_rings", &ringdist::ProcessGroupRingdist::allreduceRings,
                             "Two-level allreduce rings [ranks of this host, one rank per host], "
                             "or [] when large allreduces take one flat ring")
      .def("allreduce_compressed", &ringdist::ProcessGroupRingdist::allreduceCompressed,
           py::arg("tensor"), py::arg("codec"), py::arg("average") = false,
           py::arg("timeout") = std::chrono::milliseconds(0),
           py::call_guard<py::gil_scoped_release>(),
           "Allreduce (SUM, or AVG with average=True) with a lossy wire codec: 'fp16', 'bf16' "
           "or 'int8'; summed in float32; bitwise identical on every rank. Returns a Work.")
      .def("_allreduce_compressed_encoded",
           &ringdist::ProcessGroupRingdist::allreduceCompressedEncoded, py::arg("encoded"),
           py::arg("count"), py::arg("codec"), py::arg("average") = false,
           py::call_guard<py::gil_scoped_release>(),
           "The encoded form CUDA tensors use (for tests): takes the encoding of `count` "
           "float32 values, the Work's result is the encoding of the result")
      .def("stats", [](const ringdist::ProcessGroupRingdist& pg) {
             py::dict out;
             for (const auto& [name, s] : pg.stats()) {
               py::dict d;
               d["calls"] = s.calls;
               d["bytes_sent"] = s.bytesSent;
               d["bytes_received"] = s.bytesReceived;
               d["payload_bytes"] = s.payloadBytes;
               d["seconds"] = s.seconds;
               d["inline_calls"] = s.inlineCalls;
               d["shared_core_waits"] = s.sharedCoreWaits;
               d["single_copy_bytes"] = s.singleCopyBytes;
               out[py::str(name)] = d;
             }
             return out;
           },
           "Per-operation counters since creation or reset_stats(): calls, wire bytes sent and "
           "received, payload bytes (output tensors), seconds running, calls run on the caller's "
           "thread (inline_calls), waits that skipped the spin because a peer shared the CPU "
           "(shared_core_waits), bytes copied straight from or into same-host peers' memory (single_copy_bytes)")
      .def("reset_stats", &ringdist::ProcessGroupRingdist::resetStats)
      .def("_dead_peers", &ringdist::ProcessGroupRingdist::deadPeers,
           "Ranks whose process is known to be gone (same host only).")
      .def("_trace_pickle", [](const ringdist::ProcessGroupRingdist& pg) {
        return py::bytes(pg.tracePickle());
      }, "The group's last operations in torch's flight-recorder dump format (pickled).");
  m.def("codec_roundtrip", &codecRoundTrip, py::arg("tensor"), py::arg("codec"),
        py::arg("out") = py::none(), py::arg("residual") = false,
        "decode(encode(tensor)) for a float32 CPU tensor: what the tensor becomes as one rank's "
        "contribution to a compressed allreduce; with residual=True, tensor - that (the error "
        "that error feedback carries to the next step). Written into out if given.");
  m.def("codec_encoded_bytes", [](const std::string& name, size_t count) {
          return ringdist::encodedBytes(ringdist::parseCodec(name), count);
        }, py::arg("codec"), py::arg("count"));
  m.def("codec_kernel_family", &ringdist::kernelFamily);
  m.def("topk_select", &topkSelect, py::arg("grad"), py::arg("residual"), py::arg("k"),
        py::arg("packed"),
        "Top-k of x = grad + residual (residual None: x = grad) by magnitude, ties to the lower "
        "index: packed[:k] = values, packed[k:] = int32 indices (as float32 bits), ascending. "
        "The residual becomes x with the selected entries zeroed. grad is not modified. CPU "
        "tensors, or CUDA tensors of one GPU (queued on its current stream).");
  m.def("topk_scatter", &topkScatter, py::arg("parts"), py::arg("world"), py::arg("k"),
        py::arg("out"),
        "out = zeros, then out[idx] += value / world for each rank's packed [values | indices] "
        "block of parts, in rank order (bitwise identical on every rank). CPU tensors, or CUDA "
        "tensors of one GPU (current stream; waits for the GPU to check the indices).");
  m.def("topk_kernel_family", &ringdist::kernelFamily);
  m.def("create_backend", &ringdist::createBackend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("bind_ip"),
        py::call_guard<py::gil_scoped_release>());
  m.def("_shutdown_all", &ringdist::shutdownAllBackends,
        py::call_guard<py::gil_scoped_release>(),
        "Shut down every live ringdist group (registered with atexit by torch_ringdist)");
  m.def("reduce_kernel_family", &ringdist::kernelFamily);
  ringdist::defineTestingModule(m);
  // The torch this extension was compiled against: it must be the same minor
  // version as the torch it runs with (python -m torch_ringdist checks).
  m.attr("built_with_torch") = std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
  m.def("cuda_compiled", &cudaCompiled,
        "Whether this build of the extension contains ringdist's CUDA code");
  m.def("listen_address", &ringdist::chooseListenAddress, py::arg("ifname"), py::arg("store_host"),
        "The address a rank listens on: interface ifname's if given, else the local address "
        "that routes to store_host, loopback when the store is local or unknown");
}
