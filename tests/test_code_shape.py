"""No function in csrc/ is longer than 80 lines, so each reads top to bottom (the house rule).

No processes, no build: lizard (pinned in scripts/requirements-dev.txt) finds every function of
every source file and its length in lines, comments and blank lines included. lizard does not know
the .cu and .cuh extensions, so those are read as C++. The one function allowed to be longer is
the pybind11 binding list (PYBIND11_MODULE in csrc/python/module.cc): one statement per binding.
Functions another change is splitting right now are listed in PENDING until it lands; an entry
that is no longer over the limit fails the test, so it is dropped with the split.
"""
import glob
import os

import lizard
import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 80
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
ALLOWED = {("csrc/python/module.cc", "PYBIND11_MODULE")}
PENDING = set()


def functions(path, text):
    """(name, first line, length) of each function lizard finds in `text`, from file `path`."""
    as_cpp = path if path.endswith((".h", ".cc")) else path + ".cpp"
    found = lizard.analyze_file.analyze_source_code(as_cpp, text).function_list
    return [(f.name, f.start_line, f.length) for f in found]


def too_long(root, allowed=ALLOWED):
    """'path:line name (N lines)' for each function under root/csrc over MAX_LINES, and the
    (path, name) of the `allowed` ones that are."""
    paths = glob.glob(os.path.join(root, "csrc", "**", "*"), recursive=True)
    out, excused = [], set()
    for path in sorted(p for p in paths if p.endswith(SOURCE_SUFFIXES) and os.path.isfile(p)):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, line, length in functions(rel, text):
            if length <= MAX_LINES:
                continue
            if (rel, name) in allowed:
                excused.add((rel, name))
            else:
                out.append(f"{rel}:{line} {name} ({length} lines)")
    return out, excused


def test_no_function_over_80_lines():
    long, excused = too_long(REPO, ALLOWED | PENDING)
    assert not long, (f"{len(long)} function(s) over {MAX_LINES} lines; split each into "
                      "functions that read top to bottom:\n" + "\n".join(long))
    done = sorted(PENDING - excused)
    assert not done, (f"no longer over {MAX_LINES} lines (or renamed): drop from PENDING in "
                      f"tests/test_code_shape.py: {done}")


def test_the_check_finds_long_functions(tmp_path):
    """The check itself: a function of 81 lines is named, in a .cc and in a .cu file (CUDA
    syntax included), while one of 80 lines and the allowed binding list pass."""
    def function(name, lines, prefix=""):
        body = [f"  x += {i};" for i in range(lines - 2)]
        return "\n".join([f"{prefix}void {name}(int& x) {{", *body, "}", ""])

    kernel = "\n".join(["__global__ void scaleKernel(float* x, int n) {",
                        "  if (threadIdx.x < n) x[threadIdx.x] *= 2;", "}",
                        "void launch(float* x, int n, cudaStream_t s) {",
                        *["  scaleKernel<<<1, 32, 0, s>>>(x, n);"] * (MAX_LINES - 2), "}", ""])
    binding = "\n".join(["PYBIND11_MODULE(_C, m) {", *["  m.def(\"f\", &f);"] * 90, "}", ""])
    files = {
        "csrc/collectives/long.cc": function("ringdist::fits", 80) + function("longLoop", 81),
        "csrc/cuda/long.cu": kernel + function("longKernelHost", 81, "static "),
        "csrc/cuda/fits.cuh": function("fitsToo", 80, "__device__ "),
        "csrc/python/module.cc": binding,
    }
    for rel, text in files.items():
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        (tmp_path / rel).write_text(text)
    found, excused = too_long(str(tmp_path))
    assert excused == ALLOWED
    assert [entry.split(" ")[1] for entry in found] == ["longLoop", "longKernelHost"], found
    assert found[0] == "csrc/collectives/long.cc:81 longLoop (81 lines)"
    assert found[1].startswith("csrc/cuda/long.cu:")
