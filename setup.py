"""Build script for pytorch_zerocopy's compiled extension, ``pytorch_zerocopy._C``.

Whether CUDA code is built is decided from the installed torch and the toolkit, never from
whether a GPU is present:

* ``FORCE_ONLY_CPU=1``   build the CPU parts only (``csrc/cuda`` is left out).
* ``FORCE_CUDA=1``       build the CUDA parts; fail if torch or the toolkit cannot.
* otherwise              CUDA when ``torch.version.cuda`` is set and ``CUDA_HOME`` is found.
* ``TORCH_CUDA_ARCH_LIST`` the GPU architectures (default ``8.0;9.0+PTX``).

Install with ``pip install --no-build-isolation .`` so that the extension is compiled against the
torch already installed; the build records what it was built against in
``pytorch_zerocopy/_build_info.py`` and the package checks it on import.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:  # pragma: no cover - exercised only on a machine without torch
    sys.exit(
        "pytorch_zerocopy is compiled against the installed PyTorch, and none was found.\n"
        "Install torch first (on a CPU machine: pip install torch==2.13.0), then build with\n"
        "    pip install --no-build-isolation .\n"
        "(--no-build-isolation makes pip use that torch instead of downloading another one)."
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"
DEFAULT_ARCHS = "8.0;9.0+PTX"
# Benchmark-only build: the traversal kernels without their graph bounds checks, the baseline
# of benchmarks/guard_overhead.py. Such a build trusts indptr and indices (a bad graph can fault
# the kernel); build_info() and `zerocopy doctor` say so.
UNGUARDED_FLAG = "ZEROCOPY_UNGUARDED_TRAVERSAL"


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def decide_cuda() -> bool:
    if _flag("FORCE_ONLY_CPU"):
        return False
    if _flag("FORCE_CUDA"):
        if torch.version.cuda is None:
            sys.exit(f"FORCE_CUDA=1, but the installed torch {torch.__version__} is a CPU-only build.")
        if CUDA_HOME is None:
            sys.exit("FORCE_CUDA=1, but no CUDA toolkit was found: set CUDA_HOME.")
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None


def _links_libstdcxx_dynamically(cxx: str) -> bool:
    """True when `cxx` links a shared object against the shared libstdc++.

    Some toolchains (portable-binary builds) link libstdc++ statically into every shared
    object. Inside a Python process that already holds torch's shared libstdc++, such a copy
    has its own uninitialised iostream state and crashes the first time an error message is
    formatted, so the extension must not be linked that way.
    """
    readelf = shutil.which("readelf")
    if readelf is None or shutil.which(cxx) is None:
        return True  # cannot tell; assume the common case
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write("#include <sstream>\nstd::string probe(long x) { std::ostringstream s; s << x; return s.str(); }\n")
        if subprocess.run([cxx, "-shared", "-fPIC", src, "-o", lib], capture_output=True).returncode != 0:
            return True
        needed = subprocess.run([readelf, "-d", lib], capture_output=True, text=True).stdout
        return "libstdc++" in needed


def choose_linker() -> None:
    """Links with a C++ compiler that uses the shared libstdc++ (see above)."""
    cxx = os.environ.get("CXX")
    if not cxx or _links_libstdcxx_dynamically(cxx):
        return
    for candidate in ("/usr/bin/g++", "g++", "c++"):
        if shutil.which(candidate) and _links_libstdcxx_dynamically(candidate):
            print(f"pytorch_zerocopy: CXX={cxx} links libstdc++ statically, which breaks C++ "
                  f"exceptions inside torch; building with {candidate} instead", flush=True)
            os.environ["CXX"] = candidate
            return
    sys.exit(f"CXX={cxx} links libstdc++ statically into shared objects, and no other C++ compiler "
             "was found. Set CXX to a compiler that links the shared libstdc++ (e.g. the system g++).")


def sources(with_cuda: bool) -> list:
    found = ["csrc/zerocopy.cpp"]
    found += sorted(glob.glob("csrc/unified/*.cpp", root_dir=ROOT))
    found += sorted(glob.glob("csrc/cpu/*.cpp", root_dir=ROOT))
    found += sorted(glob.glob("csrc/autograd/*.cpp", root_dir=ROOT))
    if with_cuda:
        found += sorted(glob.glob("csrc/cuda/*.cpp", root_dir=ROOT))
        found += sorted(glob.glob("csrc/cuda/*.cu", root_dir=ROOT))
    return found


def write_build_info(with_cuda: bool, archs: str) -> None:
    info = {
        "version": VERSION,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if with_cuda else None,
        "cuda_archs": archs if with_cuda else None,
        "with_cuda": with_cuda,
        "unguarded_traversal": with_cuda and _flag(UNGUARDED_FLAG),
    }
    path = os.path.join(ROOT, "pytorch_zerocopy", "_build_info.py")
    with open(path, "w") as f:
        f.write("# Written by setup.py at build time; do not edit.\n")
        f.write(f"BUILD_INFO = {info!r}\n")


def openmp_flags():
    """-fopenmp where torch's ATen uses OpenMP.

    at::parallel_for is a header template whose thread fan-out is a `#pragma omp parallel`
    (ATen/ParallelOpenMP.h). Compiled without -fopenmp the pragma is ignored and every CPU
    kernel of this package silently runs on one thread. Linking with -fopenmp records
    libgomp.so.1, which resolves to the copy torch has already loaded.
    """
    config = torch.__config__.parallel_info()
    if "ATen parallel backend: OpenMP" not in config:
        return []
    return ["-fopenmp"]


def announce_build(files: list) -> None:
    """Says, before the compiler starts, how much there is to compile. pip shows a build's
    output only with -v (then ninja's [n/N] lines show progress); without it the build is a
    few silent minutes."""
    cu = sum(f.endswith(".cu") for f in files)
    jobs = f"MAX_JOBS={os.environ['MAX_JOBS']}" if os.environ.get("MAX_JOBS") else "ninja's default jobs (MAX_JOBS sets them)"
    print(f"pytorch_zerocopy: compiling {len(files) - cu} C++" + (f" and {cu} CUDA" if cu else "")
          + f" sources with {jobs}; the CPU-only build takes about 5 minutes on 2 cores, CUDA "
          "sources add more. pip shows progress with -v.", file=sys.stderr, flush=True)


def extension():
    choose_linker()
    with_cuda = decide_cuda()
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS)
    if with_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    write_build_info(with_cuda, archs)
    cxx = ["-O3", "-fvisibility=hidden"] + openmp_flags()
    announce_build(sources(with_cuda))
    kwargs = dict(
        name="pytorch_zerocopy._C",
        sources=sources(with_cuda),
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx},
        extra_link_args=openmp_flags(),
    )
    if not with_cuda:
        print("pytorch_zerocopy: building the CPU-only extension", flush=True)
        return CppExtension(**kwargs)
    print(f"pytorch_zerocopy: building with CUDA {torch.version.cuda} for {archs}", flush=True)
    kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    if _flag(UNGUARDED_FLAG):
        print(f"pytorch_zerocopy: {UNGUARDED_FLAG}=1: traversal kernels WITHOUT bounds checks (benchmarks only)",
              flush=True)
        kwargs["extra_compile_args"]["nvcc"].append(f"-D{UNGUARDED_FLAG}")
    kwargs["libraries"] = ["cuda"]  # driver API: green contexts, pointer attributes
    return CUDAExtension(**kwargs)


setup(
    version=VERSION,
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
