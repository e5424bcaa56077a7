// The Python module torch_ringdist._C: bindings only. Everything bound lives in
// libtorch_ringdist.so (the backend class, the C++ API, the kernels on tensors).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "csrc/backend/process_group.h"
#include "csrc/backend/tensor_ops.h"
#include "csrc/common/cpu.h"
#if RINGDIST_TESTING
#include "csrc/python/testing.h"
#endif
#include "torch_ringdist/ringdist.h"

namespace py = pybind11;

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
      .def_property_readonly("links", &ringdist::ProcessGroupRingdist::links,
                             "What each rank's link chose, as its socket reported it at connect "
                             "time (TCP: congestion, send_buffer, recv_buffer and whether each "
                             "buffer was set or left to autotuning); {} for self and shared memory")
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
      .def("allreduce_route", &ringdist::ProcessGroupRingdist::allreduceRoute, py::arg("bytes"),
           "The route an allreduce of that many bytes per rank (CPU memory) takes on this "
           "group, with the route model's inputs and predicted time (us) of each route it "
           "allows: route, round_trip_us, hosts, ring_us, and direct_us and "
           "halving-doubling_us where allowed; route/<codec>: the compressed allreduce's "
           "route for as many float32 values")
      .def("allreduce_compressed",
           [](ringdist::ProcessGroupRingdist& pg, at::Tensor& tensor, const std::string& codec,
              bool average, std::chrono::milliseconds timeout,
              const std::optional<at::Tensor>& residual) {
             return pg.allreduceCompressed(tensor, codec, average, timeout,
                                           residual.value_or(at::Tensor()));
           },
           py::arg("tensor"), py::arg("codec"), py::arg("average") = false,
           py::arg("timeout") = std::chrono::milliseconds(0), py::arg("residual") = py::none(),
           py::call_guard<py::gil_scoped_release>(),
           "Allreduce (SUM, or AVG with average=True) with a lossy wire codec: 'fp16', 'bf16', "
           "'int8' or 'int4'; summed in float32; bitwise identical on every rank. residual: a "
           "float32 tensor added to the input, then given what the codec lost of this rank's "
           "contributions (error feedback). Returns a Work.")
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
               d["bytes_sent_across_hosts"] = s.bytesSentAcrossHosts;
               d["payload_bytes"] = s.payloadBytes;
               d["seconds"] = s.seconds;
               d["inline_calls"] = s.inlineCalls;
               d["shared_core_waits"] = s.sharedCoreWaits;
               d["sleeps"] = s.sleeps;
               d["single_copy_bytes"] = s.singleCopyBytes;
               d["device_messages"] = s.deviceMessages;
               out[py::str(name)] = d;
             }
             return out;
           },
           "Per-operation counters since creation or reset_stats(): calls, wire bytes sent and "
           "received, bytes sent to peers on other hosts (bytes_sent_across_hosts), payload "
           "bytes (output tensors), seconds running, calls run on the caller's "
           "thread (inline_calls), waits that skipped the spin because a peer shared the CPU "
           "(shared_core_waits), shared-memory waits that slept on their doorbell (sleeps), bytes copied straight from or into same-host peers' memory (single_copy_bytes), sends handed over GPU to GPU (device_messages)")
      .def("reset_stats", &ringdist::ProcessGroupRingdist::resetStats)
      .def("_close_without_waiting", &ringdist::ProcessGroupRingdist::closeWithoutWaiting)
      .def("_dead_peers", &ringdist::ProcessGroupRingdist::deadPeers,
           "Ranks whose process is known to be gone: same-host ranks by pid, others refused "
           "at their kept listener.",
           py::call_guard<py::gil_scoped_release>())  // a round trip: probed off the caller
      .def("_link_sends", &ringdist::ProcessGroupRingdist::linkSends,
           "Per rank: [bytes it acknowledged, microseconds with bytes unacknowledged, smallest "
           "round trip in microseconds, bytes unacknowledged now] on the TCP links to it "
           "(zeros for shared memory and this rank); any thread")
      .def("_link_quiet_ms", &ringdist::ProcessGroupRingdist::linkQuietMs,
           "Per rank: milliseconds since data from it last arrived on the TCP links to it (-1 "
           "for shared memory, this rank and closed links); any thread")
      .def("_keep_links_on_error", &ringdist::ProcessGroupRingdist::keepLinksOnError,
           "From now on an error closes only the links a shrink cannot keep: the sealed TCP "
           "links stay open for the next shrink_group(SHRINK_ABORT). Only for ranks that learn "
           "of a failure another way (a check of who is alive), as a peer waiting on this rank "
           "no longer fails at once; any thread")
      .def("_cap_send_rate", &ringdist::ProcessGroupRingdist::capSendRate,
           py::arg("bytes_per_second"),
           "Caps this rank's sending rate on each TCP link (0: no cap); returns the links "
           "capped. For tests: a slow link on one machine.")
      .def("_trace_pickle", [](const ringdist::ProcessGroupRingdist& pg) {
        return py::bytes(pg.tracePickle());
      }, "The group's last operations in torch's flight-recorder dump format (pickled).");
  m.def("codec_roundtrip", &ringdist::codecRoundTrip, py::arg("tensor"), py::arg("codec"),
        py::arg("out") = py::none(), py::arg("residual") = false,
        py::call_guard<py::gil_scoped_release>(),
        "decode(encode(tensor)) for a float32 CPU tensor: what the tensor becomes as one rank's "
        "contribution to a compressed allreduce; with residual=True, tensor - that (the error "
        "that error feedback carries to the next step). Written into out if given.");
  m.def("codec_encoded_bytes", &ringdist::codecEncodedBytes, py::arg("codec"), py::arg("count"));
  m.def("codec_kernel_family", &ringdist::kernelFamily);
  m.def("topk_select", &ringdist::topkSelect, py::arg("grad"), py::arg("residual"), py::arg("k"),
        py::arg("packed"), py::call_guard<py::gil_scoped_release>(),
        "Top-k of x = grad + residual (residual None: x = grad) by magnitude, ties to the lower "
        "index: packed[:k] = values, packed[k:] = int32 indices (as float32 bits), ascending. "
        "The residual becomes x with the selected entries zeroed. grad is not modified. CPU "
        "tensors, or CUDA tensors of one GPU (queued on its current stream).");
  m.def("topk_scatter", &ringdist::topkScatter, py::arg("parts"), py::arg("world"), py::arg("k"),
        py::arg("out"), py::call_guard<py::gil_scoped_release>(),
        "out = zeros, then out[idx] += value / world for each rank's packed [values | indices] "
        "block of parts, in rank order (bitwise identical on every rank). CPU tensors, or CUDA "
        "tensors of one GPU (current stream; waits for the GPU to check the indices).");
  m.def("topk_kernel_family", &ringdist::kernelFamily);
  m.def("diloco_delta", &ringdist::dilocoDelta, py::arg("params"), py::arg("theta"),
        py::arg("out"), py::arg("residual"), py::arg("sent"),
        py::call_guard<py::gil_scoped_release>(),
        "One pass at a DiLoCo round's start: out = params (one after another) - theta; sent "
        "(unless None) = out + residual (None: out). Contiguous float32 CPU tensors.");
  m.def("diloco_outer_step", &ringdist::dilocoOuterStep, py::arg("params"), py::arg("theta"),
        py::arg("avg"), py::arg("buffer"), py::arg("first_round"), py::arg("lr"),
        py::arg("momentum"), py::arg("nesterov"), py::arg("alpha"),
        py::call_guard<py::gil_scoped_release>(),
        "One pass at a DiLoCo round's end: theta stepped as torch.optim.SGD(foreach=False) with "
        "gradient -avg and momentum buffer `buffer` (None with momentum 0; first_round: it "
        "starts as the gradient), then the parameters set to theta, or (alpha not None) to "
        "alpha * params + (1 - alpha) * theta. avg is read only. Contiguous float32 CPU tensors.");
  m.def("create_backend", &torch_ringdist::createBackend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The backend init_process_group('ringdist') makes (torch_ringdist::createBackend)");
  m.def("_shutdown_all", &ringdist::shutdownAllBackends, py::arg("wait_for_peers") = true,
        py::call_guard<py::gil_scoped_release>(),
        "Shut down every live ringdist group (registered with atexit by torch_ringdist); "
        "wait_for_peers=False aborts them instead");
  m.def("reduce_kernel_family", &ringdist::kernelFamily);
  m.def("allreduce_route_model", &ringdist::ProcessGroupRingdist::modelAllreduce,
        py::arg("ranks"), py::arg("bytes"), py::arg("round_trip_us"),
        py::arg("link_bits_per_s") = 10e9,
        "The route model's prediction for an allreduce of `bytes` over `ranks` hosts, one rank "
        "each: route, and the predicted time (us) of each route allowed (ring_us, direct_us, "
        "halving-doubling_us)");
#if RINGDIST_TESTING
  ringdist::defineTestingModule(m);  // test builds only (TORCH_RINGDIST_TESTING)
#endif
  // The torch this extension was compiled against: it must be the same minor
  // version as the torch it runs with (python -m torch_ringdist checks).
  m.attr("built_with_torch") = torch_ringdist::builtWithTorch();
  m.def("cuda_compiled", &torch_ringdist::cudaCompiled,
        "Whether this build of the extension contains ringdist's CUDA code");
  m.def("listen_address", &torch_ringdist::listenAddress, py::arg("store") = py::none(),
        "The address a group on this store listens on: RINGDIST_SOCKET_IFNAME's if set, else "
        "the local address that routes to the store's host (None: MASTER_ADDR), loopback when "
        "that host is this one");
}
