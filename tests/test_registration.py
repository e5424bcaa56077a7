"""Backend registration: entry-point autoload, idempotence, error texts."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, env=None, cwd=None, timeout=120):
    # -P keeps the source tree off sys.path: the installed package is tested.
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(code)], env=full_env,
                          cwd=cwd or "/", capture_output=True, text=True, timeout=timeout)


def test_init_without_import_uses_entry_point(tmp_path):
    code = f"""
        import sys, torch, torch.distributed as dist
        store = dist.FileStore({str(tmp_path / 'store')!r}, 1)
        dist.init_process_group("ringdist", store=store, rank=0, world_size=1)
        t = torch.arange(5.)
        dist.all_reduce(t)
        assert torch.equal(t, torch.arange(5.)), t
        assert dist.get_backend() == "ringdist", dist.get_backend()
        dist.destroy_process_group()
        print("OK")
    """
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_autoload_disabled_means_unknown_backend_until_import(tmp_path):
    code = f"""
        import torch, torch.distributed as dist
        assert "ringdist" not in dist.Backend.backend_list
        import torch_ringdist
        torch_ringdist.register_backend()          # second registration is a no-op
        torch_ringdist.register_backend()
        assert dist.Backend.backend_list.count("ringdist") == 1
        print("OK")
    """
    result = _run(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_default_cpu_backend_is_not_taken_over():
    # Registering must not make ringdist the default for cpu (gloo keeps it).
    result = _run("""
        import torch.distributed as dist
        assert dist.Backend.default_device_backend_map["cpu"] == "gloo", dist.Backend.default_device_backend_map
        print("OK")
    """)
    assert result.returncode == 0, result.stderr


def test_source_tree_shadowing_gives_actionable_error(tmp_path):
    # Importing an unbuilt source checkout (a copy of this one's Python side) must say what it
    # is and give the command that builds it in place.
    import shutil
    checkout = tmp_path / "checkout"
    shutil.copytree(os.path.join(REPO, "torch_ringdist"), checkout / "torch_ringdist",
                    ignore=shutil.ignore_patterns("*.so", "lib", "include", "_build_config.py",
                                                  "__pycache__"))
    for name in ("setup.py", "CMakeLists.txt"):
        shutil.copy(os.path.join(REPO, name), checkout / name)
    code = f"""
        import sys
        # As on a machine without this checkout's in-place build: no editable-install finder.
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, {str(checkout)!r})
        import torch_ringdist
        assert torch_ringdist.__file__.startswith({str(checkout)!r}), torch_ringdist.__file__
        try:
            torch_ringdist.reduce_kernel_family()
        except ImportError as exc:
            print("MSG:", exc)
    """
    result = _run(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert f"imported from the source checkout {checkout}" in result.stdout, result.stdout
    assert f"pip install --no-build-isolation -e {checkout}" in result.stdout, result.stdout


def test_hooks_reachable_after_plain_import():
    # A fresh interpreter: `import torch_ringdist` alone gives torch_ringdist.hooks, loaded
    # on first use (the plain import stays light).
    result = _run("""
        import sys, torch_ringdist
        assert "torch_ringdist.hooks" not in sys.modules, "hooks imported eagerly"
        print("HOOKS", torch_ringdist.hooks.available())
    """)
    assert result.returncode == 0, result.stderr
    assert "HOOKS ['accumulate'" in result.stdout, result.stdout


def test_cuda_registered_exactly_when_compiled():
    """The build record (read at import torch, without loading the extension)
    agrees with what the extension itself says it contains."""
    result = _run("""
        import torch.distributed as dist, torch_ringdist
        from torch_ringdist._extension import load
        print(dist.Backend.backend_capability["ringdist"], load().cuda_compiled())
    """)
    assert result.returncode == 0, result.stderr
    devices, compiled = result.stdout.rsplit(" ", 1)
    expected = ["cpu", "cuda"] if compiled.strip() == "True" else ["cpu"]
    assert devices == str(expected), result.stdout
