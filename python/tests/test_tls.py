"""Engines on other hosts: caked's TCP listener with TLS, client certificates (mTLS) or bearer tokens naming the
principal, inline bytes only. A test CA, certificates and a rogue CA are made here with openssl."""
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from concurrent import futures

import grpc
import pytest

import cake
from cake._stubs import admin_pb2, admin_pb2_grpc
from cake.testing import SpawnedDaemon
from helpers import pattern, prompt, small_namespace

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

ENGINE_URI = "spiffe://cake-test/engine-a"
TOKEN = "0123456789abcdef0123456789abcdef"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key(name, cwd):
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", f"{name}.key",
             cwd=cwd)
    os.chmod(os.path.join(cwd, f"{name}.key"), 0o600)


def _ca(name, cwd):
    _key(name, cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj",
             f"/CN={name}", cwd=cwd)


def _signed(name, ca, subject, san, cwd):
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    with open(os.path.join(cwd, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    _ca("ca", d)
    _signed("server", "ca", "/CN=localhost", "DNS:localhost,IP:127.0.0.1", d)
    _signed("engine", "ca", "/CN=engine-a", f"URI:{ENGINE_URI}", d)
    _ca("rogue-ca", d)
    _signed("rogue", "rogue-ca", "/CN=engine-a", f"URI:{ENGINE_URI}", d)  # the same name, from the wrong CA
    _ca("next-ca", d)
    _signed("next-server", "next-ca", "/CN=localhost", "DNS:localhost,IP:127.0.0.1", d)
    token_file = os.path.join(d, "token-b")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(TOKEN + "\n")
    return lambda name: os.path.join(d, name)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(pki, port, extra=""):
    return textwrap.dedent(f"""
        [tcp]
        listen = "127.0.0.1:{port}"
        tls_cert_file = "{pki("server.pem")}"
        tls_key_file = "{pki("server.key")}"
        tls_client_ca_file = "{pki("ca.pem")}"
        {extra}

        [[access.principal]]
        name = "remote-a"
        tls_identities = ["{ENGINE_URI}"]
        tenants = ["a"]
        roles = ["engine"]

        [[access.principal]]
        name = "remote-b"
        token_file = "{pki("token-b")}"
        tenants = ["b"]
        roles = ["engine"]
    """)


@pytest.fixture(scope="module")
def tls_daemon(pki):
    port = _free_port()
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=_config(pki, port)) as d:
        d.address = f"127.0.0.1:{port}"
        yield d
        assert d.alive(), d.log()


def _client(daemon, pki, **kwargs):
    return cake.Client(address=daemon.address, tls_ca_file=pki("ca.pem"), connect_timeout_s=5, **kwargs)


def test_an_engine_with_a_client_certificate_loads_inline_bit_exact(tls_daemon, pki):
    ns = small_namespace("over-tls")
    tokens = prompt(4, seed=90)
    chunks = [pattern(c, ns.chunk_bytes, salt=9).tobytes() for c in range(4)]
    with _client(tls_daemon, pki, tls_cert_file=pki("engine.pem"), tls_key_file=pki("engine.key")) as client:
        assert client.store(ns, tokens=tokens, first_chunk=0, chunks=chunks).stored_chunks == 4
        assert client.lookup(ns, tokens=tokens).cached_chunks == 4
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            assert {e.chunk: e.data for e in load} == dict(enumerate(chunks))
            load.release()
        # Regions are this machine's shared memory: not for a caller on another host.
        with pytest.raises(cake.CakeError) as refused:
            client.register_region(1 << 16)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "inline" in refused.value.message


def test_a_token_names_its_principal_and_only_its_tenant(tls_daemon, pki):
    tokens = prompt(4, seed=90)
    with _client(tls_daemon, pki, token=TOKEN) as client:
        # The same prompt A stored: B's tenant holds none of it.
        assert client.lookup(small_namespace("over-tls"), tokens=tokens).cached_chunks == 0
        with pytest.raises(cake.CakeError) as refused:
            client.lookup(small_namespace("over-tls", tenant="a"), tokens=tokens)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(cake.CakeError) as refused:
            client.status()
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("credentials", [{"token": "not-the-token-at-all"}, {}])
def test_a_wrong_or_missing_token_is_refused(tls_daemon, pki, credentials):
    with _client(tls_daemon, pki, **credentials) as client:
        with pytest.raises(cake.CakeError) as refused:
            client.lookup(small_namespace("over-tls"), tokens=prompt(1))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_certificate_from_another_ca_or_plaintext_never_connects(tls_daemon, pki):
    with pytest.raises(cake.CakeError) as refused:
        _client(tls_daemon, pki, tls_cert_file=pki("rogue.pem"), tls_key_file=pki("rogue.key"))
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(cake.CakeError):
        cake.Client(address=tls_daemon.address, token=TOKEN, connect_timeout_s=2)  # no TLS at all
    # ... nor does a client that does not trust the daemon's certificate.
    with pytest.raises(cake.CakeError):
        cake.Client(address=tls_daemon.address, tls_ca_file=pki("rogue-ca.pem"), token=TOKEN, connect_timeout_s=2)
    # The unix socket serves as before.
    with tls_daemon.client() as local:
        local.ping()


def test_rotated_certificates_are_served_without_a_restart(pki, tmp_path):
    cert, key = str(tmp_path / "server.pem"), str(tmp_path / "server.key")
    shutil.copy(pki("server.pem"), cert)
    shutil.copy(pki("server.key"), key)
    port = _free_port()
    config = _config(pki, port, extra="tls_reload_s = 1").replace(pki("server.pem"), cert).replace(
        pki("server.key"), key)
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=config) as daemon:
        address = f"127.0.0.1:{port}"
        with cake.Client(address=address, tls_ca_file=pki("ca.pem"), token=TOKEN) as client:
            client.lookup(small_namespace("rotate"), tokens=prompt(1))
        shutil.copy(pki("next-server.key"), key)
        shutil.copy(pki("next-server.pem"), cert)
        deadline = time.monotonic() + 15
        while True:
            try:
                with cake.Client(address=address, tls_ca_file=pki("next-ca.pem"), token=TOKEN,
                                 connect_timeout_s=1) as client:
                    client.lookup(small_namespace("rotate"), tokens=prompt(1))
                break
            except cake.CakeError:
                assert time.monotonic() < deadline, daemon.log()
                time.sleep(0.2)


def test_plaintext_tcp_only_on_loopback_and_only_when_allowed(pki):
    port = _free_port()
    config = textwrap.dedent(f"""
        [tcp]
        listen = "127.0.0.1:{port}"
        allow_plaintext_loopback = true

        [[access.principal]]
        name = "sidecar"
        token_file = "{pki("token-b")}"
        tenants = ["b"]
        roles = ["engine"]
    """)
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=config) as daemon:
        with cake.Client(address=f"127.0.0.1:{port}", token=TOKEN, allow_plaintext_token_on_loopback=True) as client:
            assert client.lookup(small_namespace("plain"), tokens=prompt(2)).total_chunks == 2
        with cake.Client(address=f"127.0.0.1:{port}") as anonymous:
            with pytest.raises(cake.CakeError) as refused:
                anonymous.ping()
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "plaintext, loopback only" in daemon.log()
    with pytest.raises(RuntimeError, match="loopback"):
        SpawnedDaemon([], config=config.replace("127.0.0.1", "0.0.0.0"))


class _Eavesdropper(admin_pb2_grpc.AdminServiceServicer):
    """A plaintext server that answers Ping and keeps every call's metadata: what anyone on the path would read."""

    def __init__(self):
        self.metadata = []

    def Ping(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        return admin_pb2.PingResponse()


@pytest.fixture
def eavesdropper():
    listener = _Eavesdropper()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    admin_pb2_grpc.add_AdminServiceServicer_to_server(listener, server)
    listener.port = server.add_insecure_port("0.0.0.0:0")
    server.start()
    yield listener
    server.stop(0)


def _non_loopback_address():
    """This host's address on its way out (no packet is sent), or None on a host with loopback only."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _tokens_seen(listener):
    return [m["authorization"] for m in listener.metadata if "authorization" in m]


def test_a_token_never_travels_in_plaintext_to_another_address(eavesdropper, pki):
    host = _non_loopback_address()
    if host is None:
        pytest.skip("this host has no address but loopback")
    address = f"{host}:{eavesdropper.port}"
    for credentials in ({"token": TOKEN}, {"token_file": pki("token-b")},
                        {"token": TOKEN, "allow_plaintext_token_on_loopback": True}):  # the opt-in is loopback's only
        with pytest.raises(cake.CakeError) as refused:
            with cake.Client(address=address, connect_timeout_s=2, **credentials) as client:
                client.ping()
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "tls_ca_file" in refused.value.message and "not a loopback address" in refused.value.message
    assert _tokens_seen(eavesdropper) == []
    with cake.Client(address=address, connect_timeout_s=2) as anonymous:  # plaintext without a token: as before
        anonymous.ping()


def test_a_token_in_plaintext_on_loopback_only_with_the_explicit_opt_in(eavesdropper):
    address = f"127.0.0.1:{eavesdropper.port}"
    with pytest.raises(cake.CakeError) as refused:
        with cake.Client(address=address, token=TOKEN, connect_timeout_s=2) as client:
            client.ping()
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "allow_plaintext_token_on_loopback=True" in refused.value.message
    assert _tokens_seen(eavesdropper) == []
    with cake.Client(address=address, token=TOKEN, connect_timeout_s=2,
                     allow_plaintext_token_on_loopback=True) as client:
        client.ping()
    assert _tokens_seen(eavesdropper) == [f"Bearer {TOKEN}"]


def test_sighup_reloads_principals_and_tokens(pki, tmp_path):
    token_file = str(tmp_path / "token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(TOKEN)
    port = _free_port()
    config = _config(pki, port).replace(pki("token-b"), token_file)
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=config) as daemon:
        daemon.address = f"127.0.0.1:{port}"
        old = _client(daemon, pki, token=TOKEN)
        old.lookup(small_namespace("hup"), tokens=prompt(1))
        # The token is rotated: the old one stops working on the very next call, the new one works.
        rotated = "fedcba9876543210fedcba9876543210"
        with open(token_file, "w") as f:
            f.write(rotated)
        daemon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded access" not in daemon.log():
            assert time.monotonic() < deadline and daemon.alive(), daemon.log()
            time.sleep(0.05)
        with pytest.raises(cake.CakeError) as refused:
            old.lookup(small_namespace("hup"), tokens=prompt(1))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        old.close()
        with _client(daemon, pki, token=rotated) as new:
            new.lookup(small_namespace("hup"), tokens=prompt(1))
        # A broken config on reload keeps what was there, and says why.
        config_path = os.path.join(daemon.dir, "caked.toml")
        with open(config_path, "a") as f:
            f.write('\n[[access.principal]]\nname = "remote-b"\ntoken_file = "/x"\ntenants = ["z"]\nroles = ["engine"]\n')
        daemon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "not reloaded" not in daemon.log():
            assert time.monotonic() < deadline and daemon.alive(), daemon.log()
            time.sleep(0.05)
        assert "two [[access.principal]] entries" in daemon.log()
        with _client(daemon, pki, token=rotated) as new:
            new.lookup(small_namespace("hup"), tokens=prompt(1))
        assert daemon.alive()


def test_cakectl_over_tls_is_held_to_its_principal(tls_daemon, pki):
    from cake.testing import caked_path
    cakectl = os.path.join(os.path.dirname(os.path.abspath(caked_path())), "cakectl")
    tls = ["--address", tls_daemon.address, "--tls-ca", pki("ca.pem")]
    as_engine = tls + ["--tls-cert", pki("engine.pem"), "--tls-key", pki("engine.key")]

    def run(*args):
        return subprocess.run([cakectl, *args], capture_output=True, text=True, timeout=30)

    assert run(*as_engine, "ping").returncode == 0
    refused = run(*as_engine, "status")
    assert refused.returncode != 0 and "monitor role" in refused.stderr, refused.stderr
    assert run(*tls, "--token-file", pki("token-b"), "ping").returncode == 0
    wrong = run("--address", tls_daemon.address, "--tls-ca", pki("rogue-ca.pem"), "--token-file", pki("token-b"), "ping")
    assert wrong.returncode != 0 and "no daemon answers" in wrong.stderr
