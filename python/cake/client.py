"""Client: regions, lookups, stores and loads against caked over its unix socket; admin calls for tools."""
import ipaddress
import logging
import os
import socket as _socket
import stat
import threading
from dataclasses import dataclass, fields

import grpc

from cake._stubs import admin_pb2, admin_pb2_grpc, kv_pb2, kv_pb2_grpc
from cake.errors import CakeError, DeadlineExceeded
from cake.load import STRATEGY_NAMES, TIER_NAMES, LoadSession
from cake.regions import CudaIpcRegion, HostShmRegion

# The largest message this client sends or accepts. The daemon's own limit is server.max_message_bytes (limits()
# says it), so inline stores go in batches of at most a quarter of it, which leaves room for the prompt and the
# rest of the request, and at most INLINE_STORE_BATCH_BYTES, which keeps the copies each call makes (protobuf's,
# gRPC's) small; a larger chunk goes alone.
MAX_MESSAGE_BYTES = 1 << 30
INLINE_STORE_BATCH_BYTES = 64 << 20
# A stream opened ahead of the next load is retired unused after a third of the daemon's loader.start_timeout_ms
# (which ends a stream that sent no Start: the Start must be there well before), and after this at most.
AHEAD_MAX_AGE_S = 20.0
# The wire's enums as the Python API spells them, one table each; the tiers' and the strategies' are cake.load's.
REGION_KIND_NAMES = {kv_pb2.REGION_AUTO: "auto", kv_pb2.REGION_HOST_SHM: "host", kv_pb2.REGION_CUDA_IPC: "cuda"}
LOAD_PHASE_NAMES = {admin_pb2.LOAD_PHASE_LOOKING_UP: "looking_up", admin_pb2.LOAD_PHASE_LOADING: "loading",
                    admin_pb2.LOAD_PHASE_MET: "met"}
_ENUM_NAMES = {kv_pb2.TierKind.DESCRIPTOR.full_name: TIER_NAMES,
               kv_pb2.RegionKind.DESCRIPTOR.full_name: REGION_KIND_NAMES,
               kv_pb2.LoadPlan.Strategy.DESCRIPTOR.full_name: STRATEGY_NAMES,
               admin_pb2.LoadPhase.DESCRIPTOR.full_name: LOAD_PHASE_NAMES}
_REGION_KINDS = {name: kind for kind, name in REGION_KIND_NAMES.items()}
# The tiers an admin call may name ("none" is no tier).
_TIERS = {name: tier for tier, name in TIER_NAMES.items() if tier != kv_pb2.TIER_NONE}
_MODES = {"cake": kv_pb2.LoadStart.MODE_CAKE, "io_only": kv_pb2.LoadStart.MODE_IO_ONLY}
SYSTEM_SOCKET = "/run/cake/caked.sock"
_OWN_SOCKET_REMEDY = ("not used, since whoever controls it could pose as your daemon and receive your prompts: have "
                      "it removed (by its owner or root) before starting your caked, or pass socket= or set "
                      "CAKE_SOCKET to your daemon's socket")
_SYSTEM_SOCKET_REMEDY = ("not used: ask the administrator to check caked.service, or pass socket= or set CAKE_SOCKET "
                         "to your daemon's socket")

log = logging.getLogger("cake.client")


def _socket_candidates(euid, environ):
    """Where a daemon's socket may be for this user, in the order clients look (caked uses the first for itself,
    spelled as caked spells it: "$XDG_RUNTIME_DIR" + "/cake/caked.sock", a trailing slash kept). The C++
    DefaultSocketCandidates is the same rule; tests/golden/socket_choice.toml pins both."""
    if euid == 0:
        return [SYSTEM_SOCKET]
    runtime = environ.get("XDG_RUNTIME_DIR")
    own = f"{runtime}/cake/caked.sock" if runtime else f"/tmp/cake-{euid}/caked.sock"
    # The system daemon (systemd's, /run/cake) serves users in its group too.
    return [own, SYSTEM_SOCKET]


class _Refused(Exception):
    """A candidate socket that exists but must not be used; the text says why and what to do."""


def _check_socket_folder(folder, euid, remedy):
    """The daemon's rule for its socket's folder (server/daemon.cc, base/socket_folder.h): a real folder (not a
    symbolic link) owned by this user or root; where its parent is writable by others (/tmp), anyone may have made
    it first, so there it must be this user's own and writable by nobody else. False when it does not exist;
    raises _Refused when it breaks the rule, in the C++ CheckSocketFolder's words (tests/golden/socket_choice.toml
    pins the two together)."""
    folder = folder.rstrip("/") or "/"
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise _Refused(f"the socket folder {folder} cannot be inspected: {error.strerror}; {remedy}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            problem = f"is a symbolic link (to {os.readlink(folder)})"
        except OSError:
            problem = "is a symbolic link"
        raise _Refused(f"the socket folder {folder} {problem}; {remedy}")
    if not stat.S_ISDIR(st.st_mode):
        raise _Refused(f"the socket folder {folder} is not a folder; {remedy}")
    parent = os.path.dirname(folder) or "."
    try:
        shared_parent = bool(os.stat(parent).st_mode & stat.S_IWOTH)
    except OSError as error:
        raise _Refused(f"the socket folder {folder} cannot be judged: its parent {parent} cannot be inspected "
                       f"({error.strerror}); {remedy}") from None
    if st.st_uid != euid and (shared_parent or st.st_uid != 0):
        raise _Refused(f"the socket folder {folder} belongs to another user (uid {st.st_uid}); {remedy}")
    # Writable by others is what lets them swap the socket; reading the folder only shows its name.
    # In /tmp the group counts too; anywhere, a folder every user may write to without the sticky bit lets any user
    # who reaches it replace the socket (base/socket_folder.cc's rule).
    open_to_all = st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX
    if (shared_parent and st.st_mode & 0o022) or open_to_all:
        raise _Refused(f"the socket folder {folder} is open to other users (mode {st.st_mode & 0o7777:04o}), "
                       f"who could replace the socket in it; {remedy}")
    return True


def _check_socket_file(path, remedy):
    """Whether a unix socket is at `path` (lstat: a symbolic link is not one); raises _Refused for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise _Refused(f"the socket {path} cannot be inspected: {error.strerror}; {remedy}") from None
    if stat.S_ISSOCK(st.st_mode):
        return True
    instead = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
               else "a regular file" if stat.S_ISREG(st.st_mode) else "another kind of file")
    raise _Refused(f"the socket {path} is {instead}, not a unix socket; {remedy}")


def _choose_socket(euid, environ):
    """(path, refusals): _choose_among this user's candidates (_socket_candidates)."""
    candidates = _socket_candidates(euid, environ)
    return _choose_among(candidates[0] if len(candidates) > 1 else None, candidates[-1], euid)


def _choose_among(own, system, euid):
    """(path, refusals): the socket to use by the daemon's rule, or None when none is usable, and why each candidate
    that exists was refused. This user's own daemon first (own; None for root), when its folder passes the rule
    and it is a socket; else the system daemon's, when it is a socket (its folder belongs to the unit's user, and
    only root creates entries in /run, so no other user can have put it there). The C++ ChooseDaemonSocket is the
    same rule (path None there: UNAVAILABLE without refusals, FAILED_PRECONDITION with them);
    tests/golden/socket_choice.toml pins both."""
    refusals = []
    if own is not None:
        try:
            if _check_socket_folder(os.path.dirname(own), euid, _OWN_SOCKET_REMEDY) and \
                    _check_socket_file(own, _OWN_SOCKET_REMEDY):
                return own, refusals
        except _Refused as refused:
            refusals.append(str(refused))
    try:
        if _check_socket_file(system, _SYSTEM_SOCKET_REMEDY):
            return system, refusals
    except _Refused as refused:
        refusals.append(str(refused))
    return None, refusals


def _find_socket():
    """The socket Client() connects to when given none: $CAKE_SOCKET as given (the user's choice, unchecked, as
    socket= is), else the daemon's rule. A refused candidate is logged as a warning even when another answers (a
    squatted /tmp/cake-<uid> is worth knowing about); raises CakeError(FAILED_PRECONDITION) naming each refused
    one when nothing usable remains. Nothing there at all: this user's own path, where its daemon would listen."""
    explicit = os.environ.get("CAKE_SOCKET")
    if explicit:
        return explicit
    euid = os.geteuid()
    path, refusals = _choose_socket(euid, os.environ)
    for refusal in refusals:
        log.warning("cake: %s", refusal)
    if path is not None:
        return path
    if refusals:
        raise CakeError(grpc.StatusCode.FAILED_PRECONDITION, "no usable daemon socket. " + ". ".join(refusals))
    own = _socket_candidates(euid, os.environ)[0]
    try:
        _claim_own_folder(os.path.dirname(own), euid)
    except _Refused as refused:
        raise CakeError(grpc.StatusCode.FAILED_PRECONDITION, f"no usable daemon socket. {refused}") from None
    return own


def _claim_own_folder(folder, euid):
    """Makes this user's own socket folder, closed to others, before the client waits there for a daemon: gRPC
    connects (and reconnects) to whatever socket is at the path, and where the folder's parent is open to all
    (/tmp), another user who made the folder first could put a socket of its own in it while the client waits, and
    be sent every prompt. A folder this user made (mode 0700, in a sticky /tmp that no one else may rename it out
    of) holds only what this user (or root) puts there; its daemon uses it as its own. One that appeared meanwhile
    is judged by the daemon's rule (_Refused when it breaks it)."""
    try:
        os.mkdir(folder, 0o700)
        return
    except FileExistsError:
        pass
    except OSError as error:
        raise _Refused(f"the socket folder {folder} cannot be made: {error.strerror}; {_OWN_SOCKET_REMEDY}") from None
    if not _check_socket_folder(folder, euid, _OWN_SOCKET_REMEDY):
        raise _Refused(f"the socket folder {folder} vanished while it was being made; {_OWN_SOCKET_REMEDY}")


def default_socket_path():
    """The daemon's socket by the rule caked and cakectl use, for display: $CAKE_SOCKET when set (as given); else
    /run/cake/caked.sock for root; else this user's own daemon's socket ($XDG_RUNTIME_DIR/cake/caked.sock, or
    /tmp/cake-<uid>/caked.sock) when its folder passes the daemon's rule (a real folder of this user's, closed to
    others in /tmp) and it is a socket, else the system daemon's when it is a socket. When none is usable: this
    user's own path if nothing is there at all, else the system daemon's (never a refused path). Client() raises
    instead, saying why."""
    explicit = os.environ.get("CAKE_SOCKET")
    if explicit:
        return explicit
    euid = os.geteuid()
    path, refusals = _choose_socket(euid, os.environ)
    if path is not None:
        return path
    return SYSTEM_SOCKET if refusals else _socket_candidates(euid, os.environ)[0]


def _is_loopback(address):
    """Whether a "host:port" target names this host over loopback (127.0.0.0/8, [::1] or localhost); anything
    else, a gRPC scheme prefix included, is not."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class LookupResult:
    total_chunks: int     # full chunks in the prompt
    cached_chunks: int    # the cached prefix is [0, cached_chunks)
    tiers: list           # per cached chunk, the fastest tier holding it: "dram", "disk" or "remote"
    chunk_bytes: int
    prefetch_chunks: int = 0  # with prefetch=True: chunks the daemon queued for copying into DRAM


@dataclass(frozen=True)
class StoreResult:
    stored_chunks: int
    already_cached: int   # already in DRAM; not written again


@dataclass(frozen=True)
class Limits:
    """What the daemon accepts (KvService.GetLimits; field names as in kv.proto). A daemon older than GetLimits
    does not say: then these defaults, its default configuration's, stand in, and from_daemon is False.
    tests/golden/limit_defaults.toml pins them against the C++ client's DaemonLimits{} and the daemon's own
    DaemonConfig{} (python/tests/test_golden_rules.py, tests/client/limit_defaults_golden_test.cc)."""
    max_message_bytes: int = 256 << 20
    load_start_timeout_ms: int = 60000
    load_idle_timeout_ms: int = 60000
    default_chunk_tokens: int = 256
    max_chunk_tokens: int = 1 << 16
    min_chunk_bytes: int = 4096
    max_prompt_tokens: int = 1 << 20
    region_lease_ms: int = 30000
    default_load_window: int = 4
    max_load_window: int = 64
    max_region_bytes: int = 64 << 30
    from_daemon: bool = False


_LIMIT_FIELDS = [f.name for f in fields(Limits) if f.name != "from_daemon"]


def _repeated(field):
    """protobuf 7 has only FieldDescriptor.is_repeated; Debian's 4.21 (the 3.21 release) only .label."""
    is_repeated = getattr(field, "is_repeated", None)
    return is_repeated if is_repeated is not None else field.label == field.LABEL_REPEATED


def _plain(field, value):
    """One value of a message's field as a plain Python value: a message as a dict, an enum as the Python API
    spells it ("dram", "host", "io_only", "met"; a value this client does not know stays a number)."""
    if field.message_type is not None:
        return _to_dict(value)
    if field.enum_type is not None:
        return _ENUM_NAMES.get(field.enum_type.full_name, {}).get(value, value)
    return value


def _to_dict(message):
    """A message as a dict of plain Python values (protobuf's JSON printer would turn uint64 into strings)."""
    return {field.name: [_plain(field, v) for v in getattr(message, field.name)] if _repeated(field)
            else _plain(field, getattr(message, field.name)) for field in message.DESCRIPTOR.fields}


def _tier(name):
    """The wire's TierKind of a tier's name; ValueError (before any call) for anything else."""
    if name not in _TIERS:
        raise ValueError(f"tier {name!r} is not one of {', '.join(_TIERS)}")
    return _TIERS[name]


def _prompt(tokens, chunk_keys):
    if (tokens is None) == (chunk_keys is None):
        raise ValueError("give exactly one of tokens and chunk_keys")
    if tokens is not None:
        if hasattr(tokens, "tolist"):  # numpy arrays and torch tensors
            tokens = tokens.tolist()
        elif not isinstance(tokens, list):
            tokens = list(tokens)
        return kv_pb2.Prompt(tokens=tokens)
    return kv_pb2.Prompt(chunk_keys=[bytes(k) for k in chunk_keys])


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call: how a TCP client without a certificate names itself."""

    def __init__(self, token):
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        # gRPC hands interceptors its own call details, a namedtuple.
        return details._replace(metadata=list(details.metadata or []) + [self._metadata])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class Client:
    """A connection to caked. Thread-safe (gRPC channels are); every call raises CakeError on a refusal.

    socket: the daemon's unix socket path, used as given (default: $CAKE_SOCKET as given, else the daemon's own
    rule, as default_socket_path(); a fallback socket whose folder another user could control is refused, with a
    warning, and the error says why when nothing usable remains). client_id: who owns this client's regions (default
    "<hostname>-<pid>"). timeout_s: deadline of each unary call. load_timeout_s: how long any wait of a load (its
    Plan, its next chunk, Done, its end after Release) goes on while the daemon sends nothing; then the load is
    cancelled and the wait raises DeadlineExceeded. connect_timeout_s: how long the constructor waits for the daemon
    to answer (then CakeError UNAVAILABLE); None does not wait: calls fail until the daemon answers, then work.

    Engines on another host connect over TCP instead: address="host:port" with tls_ca_file (the CA that signed
    the daemon's certificate) and either a client certificate (tls_cert_file, tls_key_file: mTLS) or a bearer
    token (token=..., or token_file=...). Over TCP there are no regions: loads and stores carry inline bytes.
    Without tls_ca_file the connection is plaintext, which the daemon accepts on a loopback address only; a bearer
    token is never sent in plaintext (the C++ client refuses it too), except to a loopback address when the caller
    says so with allow_plaintext_token_on_loopback=True (tests, a sidecar on the same host)."""

    def __init__(self, socket=None, client_id=None, connect_timeout_s=5.0, timeout_s=60.0, address=None,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None, tls_server_name=None, token=None,
                 token_file=None, allow_plaintext_token_on_loopback=False, load_timeout_s=30.0,
                 accept_loaded_batch=True):
        self.client_id = client_id or f"{_socket.gethostname()}-{os.getpid()}"
        # Region loads take several landed chunks per message (LoadStart.accept_loaded_batch); False asks for one
        # per message, as clients before the field got (cake_bench.client_load --one-chunk-per-message measures
        # what that costs).
        self.accept_loaded_batch = accept_loaded_batch
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if (token is not None or token_file is not None) and address is not None and tls_ca_file is None:
            # Anyone on the path (or on the host, for a port another process took) would read the token and be
            # this principal from then on.
            if not _is_loopback(address):
                raise CakeError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"a bearer token travels only over TLS: give the daemon's CA (tls_ca_file); "
                                f"{address} is not a loopback address, where plaintext could be allowed")
            if not allow_plaintext_token_on_loopback:
                raise CakeError(grpc.StatusCode.INVALID_ARGUMENT,
                                "a bearer token travels only over TLS: give the daemon's CA (tls_ca_file), or, "
                                f"for the loopback address {address}, allow_plaintext_token_on_loopback=True")
        if token_file is not None:
            token = _read(token_file).decode().strip()
        if address is None:
            self.socket_path = socket or _find_socket()
            target = "unix:" + self.socket_path
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self.socket_path = None
            target = address
            if tls_ca_file is not None:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=_read(tls_ca_file),
                    private_key=_read(tls_key_file) if tls_key_file else None,
                    certificate_chain=_read(tls_cert_file) if tls_cert_file else None)
                if tls_server_name:
                    options.append(("grpc.ssl_target_name_override", tls_server_name))
                self._channel = grpc.secure_channel(address, credentials, options=options)
            else:
                self._channel = grpc.insecure_channel(address, options=options)
        self._raw_channel = self._channel
        if token is not None:
            self._channel = grpc.intercept_channel(self._channel, _BearerToken(token))
        try:
            if connect_timeout_s is not None:  # None: connect on the first call (a daemon that starts later)
                grpc.channel_ready_future(self._raw_channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            self._raw_channel.close()
            raise CakeError(grpc.StatusCode.UNAVAILABLE,
                            f"no daemon answers on {target} (is caked running? is the address right? does its "
                            "access policy name this user? for TLS: do the certificates match?)") from None
        self._kv = kv_pb2_grpc.KvServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._regions = {}
        # The daemon releases a region its owner has not named for its lease (a dead client cannot hold memory
        # for ever); while this client is open, a thread renews each of its regions every third of the lease.
        self._lease_lock = threading.Lock()
        self._renew_period_s = 10.0
        self._closing = threading.Event()
        self._renewer = None
        self._ahead_lock = threading.Lock()
        self._ahead = None  # a LoadSession opened ahead of the next load()
        self._limits = None  # limits(), once asked

    def close(self):
        self._closing.set()
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
        if self._renewer is not None:
            self._renewer.join()  # its renewal calls have deadlines of their own
        for region in list(self._regions.values()):
            try:
                self.release_region(region)
            except DeadlineExceeded:
                # A silent daemon: one deadline is enough to wait on closing. It frees the rest when their leases
                # run out (they are unmapped here already, or will be with the process).
                for rest in list(self._regions.values()):
                    rest.close()
                self._regions.clear()
                break
            except CakeError:
                pass
        self._raw_channel.close()

    def _keep_renewing(self, lease_ms):
        with self._lease_lock:
            if lease_ms > 0:
                self._renew_period_s = min(self._renew_period_s, lease_ms / 3000.0)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_leases, name="cake-region-leases", daemon=True)
                self._renewer.start()

    def _renew_leases(self):
        while not self._closing.wait(self._renew_period_s):
            try:
                self._renew_all(self._renew_period_s)
            except ValueError:
                return  # the channel was closed under us

    def _renew_all(self, timeout_s):
        """Renews every region's lease now; forgets those the daemon answers NOT_FOUND (released meanwhile, expired,
        or a daemon that restarted): the ids forgotten."""
        lost = set()
        for region_id in list(self._regions):
            try:
                self._kv.RenewRegion(kv_pb2.RenewRegionRequest(client_id=self.client_id, region_id=region_id),
                                     timeout=timeout_s)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    self._regions.pop(region_id, None)
                    lost.add(region_id)
        return lost

    def check_regions(self, timeout_s=1.0):
        """Asks the daemon now whether it still holds each of this client's regions (rather than at the next lease
        renewal): one region found unknown usually means the daemon restarted and lost them all, and holds_region()
        then says so for every one at once. Returns the ids it no longer holds."""
        return self._renew_all(timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _call(self, method, request, timeout_s=None):
        try:
            return method(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as error:
            raise CakeError.from_rpc_error(error) from None

    # --- KvService ------------------------------------------------------------------------------------------
    def limits(self):
        """What the daemon accepts (message size, timeouts, chunk and window bounds), as Limits; asked once, then
        kept. A daemon older than GetLimits answers UNIMPLEMENTED: its default configuration's values then."""
        if self._limits is None:  # two threads asking at once both ask the daemon, and agree
            try:
                reply = self._kv.GetLimits(kv_pb2.GetLimitsRequest(), timeout=self.timeout_s)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise CakeError.from_rpc_error(error) from None
                self._limits = Limits()
            else:
                self._limits = Limits(**{name: getattr(reply, name) for name in _LIMIT_FIELDS}, from_daemon=True)
        return self._limits

    def _inline_store_batch_bytes(self):
        return min(INLINE_STORE_BATCH_BYTES, self.limits().max_message_bytes // 4)

    def _ahead_max_age_s(self):
        return min(AHEAD_MAX_AGE_S, self.limits().load_start_timeout_ms / 3000.0)

    def register_region(self, size, kind="host", device=0):
        """Creates a region of `size` bytes ("host", "cuda" or "auto": device memory where the daemon serves
        it, else host) and maps it here. Returns a HostShmRegion or a CudaIpcRegion."""
        if kind not in _REGION_KINDS:
            raise ValueError(f"region kind {kind!r} is not one of {', '.join(_REGION_KINDS)}")
        reply = self._call(self._kv.RegisterRegion, kv_pb2.RegisterRegionRequest(
            client_id=self.client_id, bytes=size, kind=_REGION_KINDS[kind], device=device))
        try:
            if reply.kind == kv_pb2.REGION_CUDA_IPC:
                region = CudaIpcRegion(reply.region_id, reply.bytes, reply.cuda_ipc_handle, device)
            else:
                region = HostShmRegion(reply.region_id, reply.bytes, reply.shm_name)
        except Exception:
            # Mapped nowhere: give the memory back rather than leave it held until the daemon stops.
            self._call(self._kv.ReleaseRegion,
                       kv_pb2.ReleaseRegionRequest(client_id=self.client_id, region_id=reply.region_id))
            raise
        self._regions[region.id] = region
        self._keep_renewing(reply.lease_ms)
        return region

    def holds_region(self, region):
        """Whether the daemon is believed to hold the region: false once a lease renewal was answered NOT_FOUND
        (the daemon restarted, or the lease ran out while it was unreachable) or it was released."""
        return region.id in self._regions

    def release_region(self, region, timeout_s=None):
        """Unmaps the region here, then has the daemon free it (a load still writing keeps it alive until done).
        Raises DeadlineExceeded when the daemon does not answer within timeout_s (default: the client's); the
        region is unmapped here all the same, and the daemon frees it when its lease runs out."""
        region.close()
        self._regions.pop(region.id, None)
        self._call(self._kv.ReleaseRegion,
                   kv_pb2.ReleaseRegionRequest(client_id=self.client_id, region_id=region.id), timeout_s)

    def lookup(self, ns, tokens=None, chunk_keys=None, prefetch=False):
        """How much of the prompt is cached, and where. prefetch=True says the prompt will be loaded soon (its
        request waits in the engine's queue): the daemon copies its chunks on disk or in Redis into DRAM meanwhile,
        the tail first, with I/O no running load needs; the load that follows finds them there."""
        reply = self._call(self._kv.Lookup, kv_pb2.LookupRequest(namespace=ns.to_proto(),
                                                                 prompt=_prompt(tokens, chunk_keys),
                                                                 prefetch=prefetch))
        return LookupResult(total_chunks=reply.total_chunks, cached_chunks=reply.cached_chunks,
                            tiers=[TIER_NAMES.get(t, "none") for t in reply.chunk_tiers],
                            chunk_bytes=reply.chunk_bytes, prefetch_chunks=reply.prefetch_chunks)

    def store(self, ns, tokens=None, chunk_keys=None, first_chunk=0, chunk_count=None, region=None,
              region_offset=0, chunks=None):
        """Stores chunks [first_chunk, first_chunk + chunk_count) of the prompt: from `region` (laid out one after
        another from region_offset) or inline (`chunks`, a list of chunk_bytes-long bytes). The daemon has copied
        the bytes when this returns: the engine may overwrite its region then."""
        request = kv_pb2.StoreRequest(client_id=self.client_id, namespace=ns.to_proto(),
                                      prompt=_prompt(tokens, chunk_keys), first_chunk=first_chunk)
        if chunks is not None:
            if region is not None:
                raise ValueError("give a region or inline chunks, not both")
            chunks = [bytes(c) for c in chunks]
            if chunk_count is None:
                batch_bytes = self._inline_store_batch_bytes()
                if sum(len(c) for c in chunks) > batch_bytes:
                    return self._store_inline_batches(ns, tokens, chunk_keys, first_chunk, chunks, batch_bytes)
            request.inline_chunks.extend(chunks)
            request.chunk_count = len(chunks) if chunk_count is None else chunk_count
        else:
            if region is None:
                raise ValueError("give a region (with region_offset) or inline chunks")
            if chunk_count is None:
                raise ValueError("chunk_count is needed with a region")
            request.region_id = region.id
            request.region_offset = region_offset
            request.chunk_count = chunk_count
        reply = self._call(self._kv.Store, request)
        return StoreResult(stored_chunks=reply.stored_chunks, already_cached=reply.already_cached)

    def _store_inline_batches(self, ns, tokens, chunk_keys, first_chunk, chunks, batch_bytes):
        stored = already = 0
        start = 0
        while start < len(chunks):
            end, size = start + 1, len(chunks[start])
            while end < len(chunks) and size + len(chunks[end]) <= batch_bytes:
                size += len(chunks[end])
                end += 1
            result = self.store(ns, tokens=tokens, chunk_keys=chunk_keys, first_chunk=first_chunk + start,
                                chunk_count=end - start, chunks=chunks[start:end])
            stored += result.stored_chunks
            already += result.already_cached
            start = end
        return StoreResult(stored_chunks=stored, already_cached=already)

    def load(self, ns, tokens=None, chunk_keys=None, region=None, region_offset=0, region_bytes=0, mode="cake",
             window=0, compute_first_chunk_s=0.0, compute_growth_s=0.0, computed_through=0):
        """Starts a load and returns its LoadSession (a context manager). region None: chunks come inline.
        mode "cake" (stop where the engine's progress meets the loads) or "io_only". The hints tell the daemon
        the engine's cost of chunk i, first + growth * i seconds. computed_through: chunks the engine holds or
        computes whatever happens (never loaded; with io_only, a fixed split)."""
        if mode not in _MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(_MODES)}")
        start = kv_pb2.LoadStart(client_id=self.client_id, namespace=ns.to_proto(),
                                 prompt=_prompt(tokens, chunk_keys), mode=_MODES[mode], window=window,
                                 compute_first_chunk_s=compute_first_chunk_s, compute_growth_s=compute_growth_s,
                                 computed_through=computed_through)
        if region is not None:
            start.region_id = region.id
            start.region_offset = region_offset
            start.region_bytes = region_bytes
            start.accept_loaded_batch = self.accept_loaded_batch  # several landed chunks per message when they queue
        # The stream opened ahead, when there is a usable one. The next load's opens when this one is released:
        # opening it now would take the GIL from the thread that reads this load's Plan.
        with self._ahead_lock:
            session, self._ahead = self._ahead, None
        if session is None or not session.usable(self._ahead_max_age_s()):
            if session is not None:
                session.cancel()
            session = self._new_session()
        return session.begin(start, chunk_bytes=ns.chunk_bytes, region_size=None if region is None else region.size,
                             on_release=self._open_ahead)

    def _new_session(self):
        return LoadSession(self._kv, release_timeout_s=self.load_timeout_s, idle_timeout_s=self.load_timeout_s)

    def _open_ahead(self):
        if self._closing.is_set() or self._ahead is not None:
            return
        ahead = self._new_session()
        with self._ahead_lock:
            if self._ahead is None and not self._closing.is_set():
                self._ahead, ahead = ahead, None
        if ahead is not None:
            ahead.cancel()

    # --- AdminService ---------------------------------------------------------------------------------------
    def ping(self):
        self._call(self._admin.Ping, admin_pb2.PingRequest())

    def status(self):
        """The daemon's status as a dict (field names as in admin.proto): each of `tiers` names its `tier` ("dram",
        "disk", "remote"), `region_kinds` what RegisterRegion can make here ("host", "cuda")."""
        reply = self._call(self._admin.Status, admin_pb2.StatusRequest())
        return _to_dict(reply)

    def stats(self):
        """Every counter by name."""
        return dict(self._call(self._admin.Stats, admin_pb2.StatsRequest()).counters)

    def evict(self, tier):
        """Drops every chunk of one tier ("dram", "disk" or "remote"); returns (chunks, bytes)."""
        request = admin_pb2.EvictRequest(tier=_tier(tier))
        reply = self._call(self._admin.Evict, request)
        return reply.chunks, reply.bytes

    def drain(self, exit_when_idle=False, resume=False):
        """Stops the daemon taking new loads (health NOT_SERVING), or takes them again with resume; with
        exit_when_idle the daemon stops once no load runs. Returns (active_loads, draining)."""
        reply = self._call(self._admin.Drain, admin_pb2.DrainRequest(exit_when_idle=exit_when_idle, resume=resume))
        return reply.active_loads, reply.draining

    def set_read_cap(self, tier, gbps):
        """Changes a capped tier's read cap (Gbit/s); returns the previous cap."""
        request = admin_pb2.SetReadCapRequest(tier=_tier(tier), gbps=gbps)
        return self._call(self._admin.SetReadCap, request).previous_gbps

    def list_regions(self):
        """Every registered region, whoever owns it, as dicts (field names as in admin.proto's RegionSummary;
        `kind` "host" or "cuda")."""
        return [_to_dict(r) for r in self._call(self._admin.ListRegions, admin_pb2.ListRegionsRequest()).regions]

    def list_loads(self):
        """Every live load as dicts (field names as in admin.proto's LoadSummary; `strategy` "cake", "io_only" or
        "compute_only", `phase` "looking_up", "loading" or "met")."""
        return [_to_dict(load) for load in self._call(self._admin.ListLoads, admin_pb2.ListLoadsRequest()).loads]

    def verify(self, tier="disk", timeout_s=None):
        """Re-reads every chunk of a tier that checksums its chunks ("disk" or "remote") and removes the corrupt
        ones; answers when done, as a dict (admin.proto's VerifyResponse). timeout_s: a large tier takes a while
        (default: the client's timeout)."""
        request = admin_pb2.VerifyRequest(tier=_tier(tier))
        return _to_dict(self._call(self._admin.Verify, request, timeout_s))
