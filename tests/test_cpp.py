"""ringdist from C++: the ctest suite of tests/cpp/, built against the installed package with
find_package(TorchRingdist) alone (CMAKE_PREFIX_PATH = torch_ringdist.cmake_prefix_path; torch
is found beside it). It runs ranks as threads of one process, 1-3 processes through a plain
launcher, torchrun --no-python, mpirun when installed, and the LibTorch example built as a
separate project and trained under each launcher, its parameters compared with a one-process
run. Each ctest test is reported here as a test of its own.
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.utils

import torch_ringdist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# torchrun of this Python (a virtual environment's bin is not always on PATH).
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))
MPIRUN = shutil.which("mpirun")

CTESTS = (["threads", "processes_1", "processes_2", "processes_3", "torchrun_2", "example_build",
           "example_reference"]
          + [f"example_{run}{check}" for run in ("launch_2", "launch_3", "accumulate_3", "torchrun_2")
             for check in ("", "_matches")])
MPI_CTESTS = ["mpirun_2", "example_mpirun_2", "example_mpirun_2_matches"]
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


def _cmake_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    # A CUDA build of torch makes find_package(Torch) look for the CUDA toolkit.
    if torch.version.cuda and "CUDA_PATH" not in env and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["CUDA_PATH"] = "/usr/local/cuda"
    return env


def _prefix_path():
    """torch_ringdist's CMake folder: enough where pip put torch beside it; torch's too where
    not (an install with --target elsewhere, as scripts/gpu_check.sh does)."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch_ringdist.__file__)))
    beside = os.path.realpath(os.path.join(site, "torch")) == os.path.realpath(
        os.path.dirname(torch.__file__))
    return torch_ringdist.cmake_prefix_path + ("" if beside else ";" + torch.utils.cmake_prefix_path)


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_cmake_env(), **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def ctest(tmp_path_factory):
    """Builds tests/cpp/ against the installed package and runs ctest once: {name: (status,
    output)}."""
    assert TORCHRUN is not None, f"torchrun not found beside {sys.executable}"
    build = tmp_path_factory.mktemp("cpp-tests")
    configure = ["cmake", "-S", os.path.join(REPO, "tests", "cpp"), "-B", str(build),
                 f"-DCMAKE_PREFIX_PATH={_prefix_path()}",
                 f"-DTORCHRUN={TORCHRUN}", f"-DMPIRUN={MPIRUN or 'MPIRUN-NOTFOUND'}"]
    if shutil.which("ninja"):
        configure.append("-GNinja")
    _run(configure, timeout=300)
    _run(["cmake", "--build", str(build), "--parallel", os.environ.get("MAX_JOBS", "2")],
         timeout=900)
    junit = build / "ctest.xml"
    subprocess.run(["ctest", "--test-dir", str(build), "--timeout", "300", "--output-junit",
                    str(junit)], capture_output=True, text=True, env=_cmake_env(), timeout=1800)
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        out = case.find("system-out")
        results[case.get("name")] = (case.get("status"), out.text if out is not None else "")
    return results


@pytest.mark.slow
def test_ctest_runs_exactly_the_expected_tests(ctest):
    expected = set(CTESTS) | (set(MPI_CTESTS) if MPIRUN else set())
    assert set(ctest) == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", CTESTS + MPI_CTESTS)
def test_ctest(ctest, name):
    if name in MPI_CTESTS and MPIRUN is None:
        pytest.skip("mpirun is not installed (benchmarks/setup_mpi.sh)")
    status, output = ctest[name]
    assert status == "run", f"ctest {name}: {status}\n{output}"
    # Teardown is silent in every C++ launch (threads, a plain launcher where rank 0 hosts
    # the store, torchrun, mpirun): no stack trace, no store error.
    noise = re.search(r"frame #\d|recvValue failed|Connection was likely closed|terminate called",
                      output or "")
    assert noise is None, f"ctest {name} printed {noise.group(0)!r}:\n{output[-3000:]}"


@pytest.mark.quick
def test_installed_package_layout():
    """One unversioned library (wheels hold no symlinks) that finds torch beside it, the module
    that finds the library, the headers and the CMake package."""
    package = os.path.dirname(torch_ringdist.__file__)
    library = os.path.join(package, "lib", "libtorch_ringdist.so")
    assert os.path.isfile(library) and not os.path.islink(library)
    assert sorted(os.listdir(os.path.join(package, "lib"))) == ["cmake", "libtorch_ringdist.so"]
    runpaths = {}
    for path in (library, torch_ringdist._extension.load().__file__):
        dynamic = _run(["readelf", "-d", path], timeout=60).stdout
        runpaths[os.path.basename(path)] = [line.split("[")[-1].rstrip("]") for line in
                                            dynamic.splitlines() if "RUNPATH" in line]
    assert runpaths["libtorch_ringdist.so"] == ["$ORIGIN/../../torch/lib"]
    assert list(runpaths.values())[1] == ["$ORIGIN/lib"]
    headers = sorted(os.listdir(os.path.join(package, "include", "torch_ringdist")))
    assert headers == ["data_parallel.h", "export.h", "ringdist.h"]
    config = os.path.join(torch_ringdist.cmake_prefix_path, "TorchRingdist")
    assert {"TorchRingdistConfig.cmake", "TorchRingdistConfigVersion.cmake",
            "TorchRingdistTargets.cmake"} <= set(os.listdir(config))


def test_package_refuses_another_torch_minor(tmp_path):
    """find_package(TorchRingdist) in a project that found a torch of another minor version
    fails at configure time and says why."""
    fake = tmp_path / "fake_torch"
    fake.mkdir()
    (fake / "TorchConfig.cmake").write_text("add_library(torch INTERFACE IMPORTED)\n")
    (fake / "TorchConfigVersion.cmake").write_text(
        'set(PACKAGE_VERSION "2.0.1")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(consumer LANGUAGES CXX)\n"
        "find_package(Torch REQUIRED)\nfind_package(TorchRingdist REQUIRED)\n")
    proc = subprocess.run(["cmake", "-S", str(project), "-B", str(tmp_path / "build"),
                           f"-DTorch_DIR={fake}", f"-DCMAKE_PREFIX_PATH={_prefix_path()}"],
                          capture_output=True, text=True, env=_cmake_env(), timeout=300)
    assert proc.returncode != 0
    text = " ".join((proc.stdout + proc.stderr).split())
    built = torch.__version__.split("+")[0]
    assert f"was built against torch {built}" in text and "torch '2.0.1'" in text, text
