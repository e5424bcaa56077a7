"""Linux on aarch64, proven on this x86-64 machine: the whole extension (library, Python
module) cross-compiled for aarch64 with warnings as errors, against the headers and libraries
of PyPI's aarch64 torch wheel and Debian's arm64 libcrypto (scripts/setup_arm.sh fetches them),
and the torch-free engine
check (tests/engine/engine_check.cc) run under qemu-aarch64 for both aarch64 kernel families.
Its digests (every reduce, conversion, codec and top-k kernel against the shared arithmetic or
a full sort, CRC32C, a two-rank group over shared memory and over TCP) must equal the x86-64
build's, for both x86 families: the same bits on both architectures.

Marked own_build: it compiles its own binaries from the sources, so CI's CUDA-build stage leaves it
to the first stage (`-m "not own_build"`).
"""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import torch.utils

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = torch.__version__.split("+")[0]
# Where scripts/setup_arm.sh puts them (scripts/build_cache.sh's RINGDIST_CACHE).
CACHE = os.environ.get("RINGDIST_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_ringdist")
ARM_TORCH = os.environ.get("RINGDIST_ARM_TORCH", os.path.join(CACHE, "arm-torch", VERSION))


def _arm_openssl():
    """Where setup_arm.sh unpacked the arm64 libcrypto of the libssl-dev installed here."""
    if os.environ.get("RINGDIST_ARM_OPENSSL"):
        return os.environ["RINGDIST_ARM_OPENSSL"]
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libssl-dev"],
                             capture_output=True, text=True).stdout.strip()
    return os.path.join(CACHE, "arm-openssl", version)


ARM_OPENSSL = _arm_openssl()
ARM_LIBCRYPTO = os.path.join(ARM_OPENSSL, "usr", "lib", "aarch64-linux-gnu")
# The engine check links libcrypto: qemu's loader finds it there.
QEMU = ["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu", "-E", f"LD_LIBRARY_PATH={ARM_LIBCRYPTO}"]

pytestmark = [pytest.mark.arm, pytest.mark.own_build]


def _run(cmd, timeout, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _build_dir(name):
    """A build folder in the checkout's build/, kept between runs: a rerun builds what changed
    (and, with ccache, a fresh clone's paths hash as this one's)."""
    build = pathlib.Path(REPO, "build", f"test-{name}-torch{VERSION}")
    build.mkdir(parents=True, exist_ok=True)
    return build


def _configure_and_build(build, *options, target=None):
    configure = ["cmake", "-S", REPO, "-B", str(build), "-DTORCH_RINGDIST_CUDA=OFF",
                 "-DTORCH_RINGDIST_ENGINE_CHECK=ON", *options]
    if shutil.which("ninja"):
        configure.append("-GNinja")
    _run(configure, 300)
    jobs = os.environ.get("MAX_JOBS", "2")
    _run(["cmake", "--build", str(build), "--parallel", jobs]
         + (["--target", target] if target else []), 1800)


@pytest.fixture(scope="module")
def native():
    """The engine check built for this machine."""
    build = _build_dir("engine-native")
    _configure_and_build(build, f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                         target="ringdist_engine_check")
    return str(build / "ringdist_engine_check")


@pytest.fixture(scope="module")
def cross():
    """Everything cross-built for aarch64, warnings as errors."""
    missing = [tool for tool in ("aarch64-linux-gnu-g++", QEMU[0]) if shutil.which(tool) is None]
    config = os.path.join(ARM_TORCH, "torch", "share", "cmake", "Torch", "TorchConfig.cmake")
    ssl = os.path.join(ARM_OPENSSL, "usr", "include", "openssl", "configuration.h")
    absent = [path for path in (config, ssl) if not os.path.exists(path)]
    if missing or absent:
        pytest.fail(f"missing {missing or absent}: run scripts/setup_arm.sh")
    build = _build_dir("aarch64")
    include = _run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                   60).stdout.strip()
    _configure_and_build(
        build, f"-DCMAKE_TOOLCHAIN_FILE={os.path.join(REPO, 'cmake', 'aarch64-linux-gnu.cmake')}",
        f"-DCMAKE_PREFIX_PATH={os.path.join(ARM_TORCH, 'torch', 'share', 'cmake')}",
        # Named outright: FindOpenSSL would take this machine's libcrypto from pkg-config.
        f"-DOPENSSL_INCLUDE_DIR={os.path.join(ARM_OPENSSL, 'usr', 'include')}",
        f"-DOPENSSL_CRYPTO_LIBRARY={os.path.join(ARM_LIBCRYPTO, 'libcrypto.so')}",
        "-DTORCH_RINGDIST_WERROR=ON", "-DTORCH_RINGDIST_PYTHON=ON", "-DTORCH_RINGDIST_TESTING=ON",
        f"-DPython3_EXECUTABLE={sys.executable}", f"-DPython3_INCLUDE_DIR={include}")
    return build


def _check(cmd):
    """Runs the engine check: (family line, {case: digest})."""
    out = _run(cmd, 600).stdout.splitlines()
    assert out[-1] == "0 failed", "\n".join(out)
    return out[0], dict(line.rsplit(None, 1) for line in out[1:-1])


@pytest.mark.slow
def test_cross_build_is_aarch64(cross):
    module = [name for name in os.listdir(cross) if name.startswith("_C") and name.endswith(".so")]
    assert len(module) == 1, os.listdir(cross)
    for name in ("libtorch_ringdist.so", module[0], "ringdist_engine_check"):
        header = _run(["readelf", "-h", str(cross / name)], 60).stdout
        assert "AArch64" in header, f"{name}:\n{header}"


@pytest.mark.slow
def test_native_families_agree(native):
    line, generic = _check([native, "--family", "generic"])
    assert line.startswith("kernel family generic")
    line, vector = _check([native])
    family = line.split()[2].rstrip(",")
    assert family in ("avx2", "generic"), line
    assert vector == generic
    assert len(generic) >= 70  # every reduce kernel, divisions, conversions, codecs, top-k, groups


@pytest.mark.slow
@pytest.mark.parametrize("family", ["neon", "generic"])
def test_emulated_aarch64_matches_x86(native, cross, family):
    _, x86 = _check([native, "--family", "generic"])
    line, arm = _check(QEMU + [str(cross / "ringdist_engine_check"), "--family", family])
    assert line.startswith(f"kernel family {family}"), line
    differing = sorted(case for case in x86 if arm.get(case) != x86[case])
    assert not differing and arm.keys() == x86.keys(), differing


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_install_elsewhere_stops_with_one_sentence(platform):
    code = f"import runpy, sys; sys.platform = {platform!r}; runpy.run_path('setup.py')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert message == ("torch_ringdist runs on Linux only (x86-64 and aarch64): its transports use "
                       f"futexes, /dev/shm and process_vm_readv, which {platform} does not have.")
