"""Compiles every csrc/cuda source for sm_90, compile-only, against the installed torch's headers.

CI has nvcc but no GPU and a CPU build of torch, so the CUDA extension cannot be linked there.
The CPU wheel still ships the CUDA headers of ATen and c10 (ATen/cuda, c10/cuda), which is all
a translation unit needs, except one generated header (c10/cuda/impl/cuda_cmake_macros.h,
a single #define) that tools/cuda_header_shim provides; this script compiles each .cu with nvcc and each .cpp under
csrc/cuda with the host compiler, using the same include paths and flags as setup.py, so CUDA
code that does not compile fails CI even where it cannot run.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import sysconfig
import tempfile

from torch.utils.cpp_extension import include_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_home() -> str:
    nvcc = subprocess.run(["which", "nvcc"], capture_output=True, text=True).stdout.strip()
    guess = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    if not os.path.exists(os.path.join(guess, "include", "cuda_runtime.h")):
        guess = "/usr/local/cuda"
    return os.environ.get("CUDA_HOME") or guess


def main(argv=None) -> int:
    """Compiles every source, or those named in ``argv`` (paths, e.g. csrc/cuda/gather_rows.cu);
    ``--define NAME`` (repeatable) compiles them with ``-DNAME`` as well, as a build switch of
    setup.py does (e.g. ZEROCOPY_UNGUARDED_TRAVERSAL)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*")
    parser.add_argument("--define", action="append", default=[], metavar="NAME")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    named = {os.path.realpath(p) for p in args.sources}
    includes = [os.path.join(ROOT, "csrc"), sysconfig.get_paths()["include"], *include_paths()]
    includes.append(os.path.join(cuda_home(), "include"))
    # Last, so a real CUDA torch's own generated header wins (see the shim's comment).
    includes.append(os.path.join(ROOT, "tools", "cuda_header_shim"))
    inc = [f"-I{p}" for p in includes]
    defines = ["-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H", "-D_GLIBCXX_USE_CXX11_ABI=1",
               *(f"-D{name}" for name in args.define)]
    failures = 0
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
    host_sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
    if named:
        unknown = named - {os.path.realpath(p) for p in sources + host_sources}
        if unknown:
            print(f"not a source under csrc/cuda: {sorted(unknown)}")
            return 2
        sources = [p for p in sources if os.path.realpath(p) in named]
        host_sources = [p for p in host_sources if os.path.realpath(p) in named]
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            out = os.path.join(tmp, os.path.basename(src) + ".o")
            cmd = ["nvcc", "-c", src, "-o", out, "-arch=sm_90", "-std=c++20", "-O3",
                   "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", *defines, *inc]
            failures += run(cmd, src)
        for src in host_sources:
            cmd = ["c++", "-fsyntax-only", "-std=c++20", "-fPIC", src, *defines, *inc]
            failures += run(cmd, src)
    print(f"cuda compile check: {len(sources) + len(host_sources) - failures} ok, {failures} failed")
    return 1 if failures else 0


def run(cmd: list, src: str) -> int:
    rel = os.path.relpath(src, ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"FAILED {rel}\n{proc.stdout}{proc.stderr}")
        return 1
    print(f"compiled {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
