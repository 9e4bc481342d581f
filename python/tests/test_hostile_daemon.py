"""The daemon is a peer like any other: a server that speaks cake.v1 but breaks the Load protocol (chunks outside
the plan or the region, wrong sizes, Done before its chunks) ends that load with CakeError(DATA_LOSS), and the
client keeps working. The server here is a real gRPC server on a unix socket, scripted per test."""
import os
from concurrent import futures

import grpc
import pytest

import cake
from cake._stubs import admin_pb2, admin_pb2_grpc, kv_pb2, kv_pb2_grpc
from helpers import small_namespace

NS = small_namespace("hostile")
CHUNK = NS.chunk_bytes


def plan(cached=4, total=4, lowest=0, chunk_bytes=CHUNK):
    return kv_pb2.LoadResponse(plan=kv_pb2.LoadPlan(load_id="x", total_chunks=total, cached_chunks=cached,
                                                    lowest_loadable=lowest, chunk_bytes=chunk_bytes))


def loaded(chunk, offset=None, nbytes=CHUNK, data=b""):
    return kv_pb2.LoadResponse(loaded=kv_pb2.ChunkLoaded(chunk=chunk, region_offset=chunk * CHUNK if offset is None
                                                         else offset, bytes=nbytes, data=data))


def done(meeting, loaded_chunks=0):
    return kv_pb2.LoadResponse(done=kv_pb2.LoadDone(meeting_chunk=meeting, loaded_chunks=loaded_chunks))


class Scripted(kv_pb2_grpc.KvServiceServicer, admin_pb2_grpc.AdminServiceServicer):
    script = []

    def Load(self, requests, context):
        next(requests)  # the Start
        yield from self.script

    def RegisterRegion(self, request, context):
        return kv_pb2.RegisterRegionResponse(region_id="r-1", kind=kv_pb2.REGION_HOST_SHM, bytes=request.bytes,
                                             shm_name=self.shm_name)

    def Ping(self, request, context):
        return admin_pb2.PingResponse()


@pytest.fixture
def hostile(tmp_path):
    servicer = Scripted()
    # A real shared-memory object for the region the fake daemon hands out.
    servicer.shm_name = f"/cake-test-{os.getpid()}"
    fd = os.open("/dev/shm" + servicer.shm_name, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8 * CHUNK)
    os.close(fd)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    kv_pb2_grpc.add_KvServiceServicer_to_server(servicer, server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    socket = str(tmp_path / "hostile.sock")
    server.add_insecure_port("unix:" + socket)
    server.start()
    client = cake.Client(socket)
    yield servicer, client
    client._channel.close()
    server.stop(0)
    os.unlink("/dev/shm" + servicer.shm_name)


BAD_SCRIPTS = {
    "chunk past the plan": [plan(), loaded(4)],
    "chunk below lowest_loadable": [plan(lowest=2), loaded(1)],
    "the same chunk twice": [plan(), loaded(3), loaded(3)],
    "offset past the region": [plan(), loaded(3, offset=8 * CHUNK)],
    "wrong chunk size": [plan(), loaded(3, nbytes=CHUNK * 2)],
    "plan of another chunk size": [plan(chunk_bytes=CHUNK + 1)],
    "plan with more cached than total": [plan(cached=5, total=4)],
    "done before its chunks": [plan(), loaded(3), done(1, 3)],
    "done past the prefix": [plan(), done(9)],
    "chunk after done": [plan(), loaded(3), loaded(2), loaded(1), loaded(0), done(0, 4), loaded(0)],
}


@pytest.mark.parametrize("name", list(BAD_SCRIPTS))
def test_a_protocol_breaking_daemon_ends_the_load_with_data_loss(hostile, name):
    servicer, client = hostile
    servicer.script = BAD_SCRIPTS[name]
    region = client.register_region(8 * CHUNK)
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region) as load:
        with pytest.raises(cake.CakeError) as error:
            load.wait_done(10)
            list(load)
            load.release(5)
        assert error.value.code == grpc.StatusCode.DATA_LOSS, error.value
    client.ping()  # the client still works


def test_inline_chunks_of_the_wrong_size(hostile):
    servicer, client = hostile
    servicer.script = [plan(), loaded(3, offset=0, nbytes=CHUNK, data=b"short")]
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens))) as load:
        with pytest.raises(cake.CakeError) as error:
            load.wait_done(10)
        assert error.value.code == grpc.StatusCode.DATA_LOSS


def test_a_well_behaved_script_passes(hostile):
    servicer, client = hostile
    servicer.script = [plan(), loaded(3), loaded(2), done(2, 2)]
    region = client.register_region(8 * CHUNK)
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region) as load:
        assert load.wait_done(10).meeting_chunk == 2
        assert [e.chunk for e in load] == [3, 2]
