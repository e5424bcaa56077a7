"""`python -m torch_ringdist` (the doctor): its facts against independent sources, and
the problems it must name."""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import torch_ringdist.__main__ as doctor
from torch_ringdist._extension import load

pytestmark = pytest.mark.quick


def _run(*args, **env):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("RINGDIST_") and k not in ("MASTER_ADDR",)}
    full.update(env)
    return subprocess.run([sys.executable, "-P", "-m", "torch_ringdist", *args], env=full,
                          capture_output=True, text=True, timeout=120)


def test_doctor_reports_this_machine():
    out = _run("--json", MASTER_ADDR="127.0.0.1", RINGDIST_SEGMENT_BYTES="64K")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    facts = report["facts"]
    ext = load()
    assert report["problems"] == []
    assert facts["torch"] == torch.__version__
    assert facts["built_with_torch"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    assert facts["cpu_kernels"] == ext.reduce_kernel_family()
    assert facts["cuda_compiled"] == ext.cuda_compiled()
    assert facts["cuda_available"] == torch.cuda.is_available()
    assert facts["listen_address"] == "127.0.0.1"
    assert facts["environment"] == {"MASTER_ADDR": "127.0.0.1", "RINGDIST_SEGMENT_BYTES": "64K",
                                    **{k: os.environ[k] for k in doctor.RELATED_ENV
                                       if k in os.environ and k != "MASTER_ADDR"}}
    assert facts["shared_memory"]["usable"] == os.path.isdir("/dev/shm")


def test_doctor_text_and_interface_choice():
    out = _run(RINGDIST_SOCKET_IFNAME="lo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "built against torch" in out.stdout and "no problems found" in out.stdout
    assert "listens on" in out.stdout and "127.0.0.1" in out.stdout
    bad = _run(RINGDIST_SOCKET_IFNAME="ringdist-no-such0")
    assert bad.returncode == 1
    assert "PROBLEM" in bad.stdout and "RINGDIST_SOCKET_IFNAME='ringdist-no-such0'" in bad.stdout


def test_doctor_names_a_torch_version_mismatch(monkeypatch):
    """An extension built for another torch minor: named, with both versions and the fix."""
    real = load()
    other = f"2.{int(torch.__version__.split('.')[1]) + 1}.0"
    stub = types.SimpleNamespace(__file__=real.__file__, built_with_torch=other,
                                 reduce_kernel_family=real.reduce_kernel_family,
                                 cuda_compiled=real.cuda_compiled,
                                 listen_address=real.listen_address)
    monkeypatch.setattr(doctor, "load", lambda: stub)
    _, problems = doctor.collect()
    assert len(problems) == 1
    assert other in problems[0] and torch.__version__ in problems[0]
    assert doctor.REINSTALL in problems[0]


def test_load_names_a_torch_version_mismatch_before_any_symbol_error():
    """The build records the torch it built against; loading the extension under another
    minor raises one ImportError naming both versions and the fix."""
    import textwrap

    code = textwrap.dedent("""
        import torch
        import torch_ringdist._build_config as built
        built.TORCH = "2.0.1"
        from torch_ringdist._extension import load
        try:
            load()
        except ImportError as exc:
            print("ERROR", exc)
        else:
            print("LOADED")
    """)
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERROR"), out.stdout
    assert "2.0.1" in out.stdout and torch.__version__ in out.stdout, out.stdout
    assert doctor.REINSTALL in out.stdout, out.stdout


def test_extension_uses_the_shared_libstdcxx():
    """A private static libstdc++ in the extension (a compiler without the libstdc++.so
    link) crashed every rank at init on a GPU machine: its iostreams were never set up."""
    out = subprocess.run(["readelf", "-d", load().__file__], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    needed = [line.split("[")[-1].rstrip("]") for line in out.stdout.splitlines() if "NEEDED" in line]
    assert "libstdc++.so.6" in needed, needed
