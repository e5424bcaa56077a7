// Python bindings: the backend class (so Python can tune it) and the
// creator that torch_ringdist registers with torch.distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "csrc/backend/process_group.h"
#include "csrc/reduce/reduce.h"
#include "csrc/transport/tcp/socket.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringdist: a ring-allreduce torch.distributed backend";
  // torch registers c10d::Backend with an intrusive_ptr holder; ours matches.
  py::module_::import("torch._C._distributed_c10d");
  py::class_<ringdist::ProcessGroupRingdist, c10d::Backend,
             c10::intrusive_ptr<ringdist::ProcessGroupRingdist>>(m, "ProcessGroupRingdist")
      .def_property("segment_bytes", &ringdist::ProcessGroupRingdist::segmentBytes,
                    &ringdist::ProcessGroupRingdist::setSegmentBytes,
                    "Bytes per pipelined segment; every rank of the group must use the same value")
      .def_property_readonly("transports", &ringdist::ProcessGroupRingdist::transports,
                             "Transport used to reach each rank: 'tcp', 'shm' or 'self'");
  m.def("create_backend", &ringdist::createBackend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("bind_ip"),
        py::call_guard<py::gil_scoped_release>());
  m.def("reduce_kernel_family", &ringdist::reduceKernelFamily);
  m.def("interface_address", &ringdist::tcp::interfaceAddress, py::arg("ifname"));
  m.def("source_address_for", &ringdist::tcp::sourceAddressFor, py::arg("host"));
}
