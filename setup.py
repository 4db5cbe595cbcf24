"""Builds the Python module dmx with CMake (the extension target _dmx and the library under it).

    python3 -m pip install --no-build-isolation .      # offline, with Debian's setuptools

Needs what scripts/install-deps.sh installs (CMake, a C++20 compiler, pybind11-dev, python3-dev).
DMX_CMAKE_ARGS adds CMake options, e.g. "-DDMX_ENABLE_CUDA=OFF"; DMX_BUILD_JOBS sets the build's
parallelism (default: the CPU count). The build takes minutes; pip shows its output (CMake's and
each compile) with -v only, so a line on the terminal says so.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).parent.resolve()
VERSION = re.search(r"project\(dmx VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)


def notice(text):
    """Prints `text` on stderr, and on the terminal when pip hides stderr (it does without -v)."""
    print(text, file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\n{text}\n")
    except OSError:  # no terminal (CI): the line above is in pip's -v output and in its error report
        pass


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        # Release: no debug info, and pybind11 strips the module (RelWithDebInfo made it 92 MB, Release 5).
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DDMX_BUILD_TESTS=OFF", "-DDMX_BUILD_BENCH=OFF", "-DDMX_BUILD_PYTHON=ON",
                     f"-DDMX_PYTHON={sys.executable}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("DMX_CMAKE_ARGS", ""))
        jobs = os.environ.get("DMX_BUILD_JOBS", str(os.cpu_count() or 1))
        notice(f"dmx: building the C++ extension with CMake and {jobs} jobs; this takes minutes (about 6 on "
               "2 cores). `pip install -v` shows each step.")
        # CMake and the build tool write to our stdout and stderr, which pip -v shows as they come.
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build), "--target", "_dmx", "-j", jobs])
        built = sorted((build / "python" / "dmx").glob("_dmx*.so"))
        if not built:
            raise RuntimeError(f"CMake built no _dmx*.so under {build / 'python' / 'dmx'}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    name="dmx",
    version=VERSION,
    description="dmx: move tensors between GPU, pinned and host memory across processes and hosts",
    license="Apache-2.0",
    python_requires=">=3.8",
    packages=["dmx"],
    package_dir={"dmx": "python/dmx"},
    package_data={"dmx": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("dmx._dmx", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
