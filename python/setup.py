"""The build steps of the cake-kvcache package that pyproject.toml cannot say.

- The version is the daemon's: `project(cake VERSION x.y.z)` in the repository's top CMakeLists.txt, read at build
  time (an sdist carries it in its PKG-INFO). One place for caked, cakectl, the .deb and this package.
- The cake.v1 stubs are generated at build time from proto/cake/v1/*.proto with grpcio-tools (a build requirement,
  pinned in pyproject.toml), into the wheel's cake/v1; nothing generated is committed. A checkout's proto/ is
  ../proto; an sdist carries a copy in proto/, so a wheel builds from the sdist alone.
- cake/_version.py (cake.__version__) is written beside the stubs.
- `pip install -e` uses setuptools' strict editable mode, the one that keeps generated files.
"""
import os
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
REQUIRED = ("cake/v1/kv.proto", "cake/v1/admin.proto")  # the package is built from every cake/v1/*.proto


def _version():
    pkg_info = HERE / "PKG-INFO"  # an sdist
    if pkg_info.is_file():
        found = re.search(r"^Version: *(\S+)", pkg_info.read_text(encoding="utf-8"), re.M)
        if found:
            return found.group(1)
    cmake = HERE.parent / "CMakeLists.txt"  # a checkout
    if cmake.is_file():
        found = re.search(r"project\(\s*cake\s+VERSION\s+([0-9][0-9A-Za-z.]*)", cmake.read_text(encoding="utf-8"))
        if found:
            return found.group(1)
    raise SystemExit(f"cake-kvcache: no version: build from a Cake checkout (its CMakeLists.txt says the daemon's "
                     f"version) or from an sdist made from one (looked in {pkg_info} and {cmake})")


def _proto_root():
    for root in (HERE / "proto", HERE.parent / "proto"):  # an sdist's copy, then the checkout's
        if all((root / proto).is_file() for proto in REQUIRED):
            return root
    raise SystemExit(f"cake-kvcache: the .proto files are missing: build from a Cake checkout (proto/ beside "
                     f"python/) or from an sdist made from one (looked for {', '.join(REQUIRED)} in "
                     f"{HERE / 'proto'} and {HERE.parent / 'proto'})")


def _protos(root):
    return sorted(path.relative_to(root).as_posix() for path in (root / "cake" / "v1").glob("*.proto"))


def generate_stubs(out_dir):
    """cake/v1/*_pb2.py and *_pb2_grpc.py under out_dir, from the .proto files, with grpcio-tools' protoc."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as error:
        raise SystemExit("cake-kvcache: building needs grpcio-tools (pyproject.toml's build requirement; pip "
                         "installs it, or use --no-build-isolation with it installed)") from error
    root = _proto_root()
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    stub_dir = Path(out_dir) / "cake" / "v1"
    stub_dir.mkdir(parents=True, exist_ok=True)
    protos = _protos(root)
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", *(str(root / proto) for proto in protos)]
    if protoc.main(args) != 0:
        raise SystemExit(f"cake-kvcache: protoc failed on {', '.join(protos)} in {root}")
    (stub_dir / "__init__.py").write_text('"""The cake.v1 wire stubs, generated from proto/cake/v1 when the package '
                                          'was built."""\n', encoding="utf-8")


class BuildPyWithStubs(build_py):
    """build_py, then the stubs and cake/_version.py into the build folder (and so into the wheel)."""

    def run(self):
        super().run()
        generate_stubs(self.build_lib)
        (Path(self.build_lib) / "cake" / "_version.py").write_text(
            f'__version__ = "{self.distribution.get_version()}"\n', encoding="utf-8")

    def get_outputs(self, include_bytecode=True):
        stubs = ["__init__.py"] + [f"{Path(proto).stem}{suffix}.py" for proto in _protos(_proto_root())
                                   for suffix in ("_pb2", "_pb2_grpc")]
        generated = [os.path.join(self.build_lib, "cake", "v1", name) for name in stubs]
        return super().get_outputs(include_bytecode) + generated + [
            os.path.join(self.build_lib, "cake", "_version.py")]


class SdistWithProtos(sdist):
    """sdist with proto/cake/v1/*.proto inside, so a wheel builds from it with no checkout around it."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = _proto_root()
        for proto in _protos(root):
            target = Path(base_dir) / "proto" / proto
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / proto, target)


class EditableStrict(editable_wheel):
    """`pip install -e ./python` in setuptools' strict mode unless told otherwise: its link tree
    (python/build/__editable__.*) holds the generated stubs beside links to the sources; the default (lenient) mode
    maps the packages to python/ alone, where there are no stubs. A new source file needs the install run again."""

    def finalize_options(self):
        self.mode = self.mode or "strict"
        super().finalize_options()


setup(version=_version(),
      cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos, "editable_wheel": EditableStrict})
