"""Running a real caked for tests, benches and demos: a private daemon in a temporary folder, stopped and
waited for when the block ends (PID 1 on these machines does not reap orphans), and killed with its parent."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

from cake.client import Client
from cake.errors import CakeError


def _die_with_parent(argv):
    """argv under util-linux's setpriv, which sets PR_SET_PDEATHSIG and execs it: the daemon dies with the test.

    Not a preexec_fn: that forces a plain fork() of a process whose gRPC threads hold locks, and the child (or the
    parent's fork handlers) crashed now and then; without preexec_fn, subprocess uses vfork/posix_spawn."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *argv] if setpriv else list(argv)


def caked_path():
    """The caked binary: $CAKE_CAKED (ctest sets it), else build/bin/caked of this checkout, else caked on PATH."""
    explicit = os.environ.get("CAKE_CAKED")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.normpath(os.path.join(here, "..", "..", "..", "build", "bin", "caked"))
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("caked")
    if found:
        return found
    raise FileNotFoundError("no caked: set CAKE_CAKED, build the repository (build/bin/caked), or install it")


class SpawnedDaemon:
    """caked on a socket in a fresh temporary folder. `args` are extra command-line flags; `config`, TOML text
    for --config (written owner-only into the folder); `open_dir` lets other users reach the socket's folder
    (tests that call as other users)."""

    def __init__(self, args=(), start_timeout_s=20.0, config=None, open_dir=False):
        self.dir = tempfile.mkdtemp(prefix="cake-py-")
        if open_dir:
            os.chmod(self.dir, 0o711)
        self.socket_path = os.path.join(self.dir, "caked.sock")
        self.log_path = os.path.join(self.dir, "caked.log")
        self._log = open(self.log_path, "wb")
        args = list(args)
        if config is not None:
            config_path = os.path.join(self.dir, "caked.toml")
            with open(os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(config)
            args = ["--config", config_path, *args]
        self._argv = _die_with_parent([caked_path(), "--run-dir", self.dir, *args])
        self._start(start_timeout_s)

    def restart(self, kill=True, start_timeout_s=20.0):
        """Ends the daemon (SIGKILL, or SIGTERM with kill=False) and starts another on the same socket and
        folder with the same flags: what was in DRAM and every region are gone, as after a crash and restart."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.process.wait()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self._start(start_timeout_s)

    def _start(self, start_timeout_s):
        self.process = subprocess.Popen(self._argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self.process.poll() is not None:
                log = self.log()
                self.stop()
                raise RuntimeError(f"caked exited with {self.process.returncode} during start-up:\n{log}")
            if os.path.exists(self.socket_path):
                try:
                    Client(self.socket_path, connect_timeout_s=1.0).close()
                    return
                except CakeError:
                    pass
            if time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"caked did not answer on {self.socket_path} within {start_timeout_s} s:\n{log}")
            time.sleep(0.05)

    def client(self, **kwargs):
        return Client(self.socket_path, **kwargs)

    def alive(self):
        return self.process.poll() is None

    def log(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, timeout_s=20.0):
        """SIGTERM, then SIGKILL after timeout_s; always waited for. Returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
