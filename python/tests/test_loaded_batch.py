"""Several landed chunks per message (LoadStart.accept_loaded_batch, LoadResponse.loaded_batch): a client that
says it takes them gets every chunk exactly once, in fewer messages than chunks when they queue up; a client that
does not say so (every client written before the field) gets one ChunkLoaded per message, as before."""
import queue

from cake._stubs import kv_pb2

from helpers import fill, pattern, prompt, small_namespace

CHUNKS = 2048  # 4 KiB chunks: the daemon lands them faster than a Python client reads one message each


def stored(client, ns, tokens, chunks):
    region = client.register_region(chunks * ns.chunk_bytes)
    fill(region, chunks, ns.chunk_bytes, salt=5)
    client.store(ns, tokens=tokens, first_chunk=0, chunk_count=chunks, region=region)
    region.numpy()[:] = 0
    return region


def test_batches_carry_every_chunk_once(client):
    ns = small_namespace("loaded-batch")
    tokens = prompt(CHUNKS, seed=71)
    region = stored(client, ns, tokens, CHUNKS)
    with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
        events = list(load)
        assert load.done.meeting_chunk == 0
        messages = load.loaded_messages
    assert sorted(e.chunk for e in events) == list(range(CHUNKS))
    assert [e.chunk for e in events] == sorted((e.chunk for e in events), reverse=True)  # highest first
    view = region.numpy()
    for e in events:
        assert (view[e.region_offset:e.region_offset + ns.chunk_bytes] == pattern(e.chunk, ns.chunk_bytes, 5)).all()
    print(f"{CHUNKS} chunks in {messages} messages")
    assert messages < CHUNKS, "no batch formed"


def test_a_client_without_the_flag_gets_one_chunk_per_message(client):
    ns = small_namespace("loaded-batch-old")
    tokens = prompt(CHUNKS, seed=72)
    region = stored(client, ns, tokens, CHUNKS)
    start = kv_pb2.LoadStart(client_id=client.client_id, namespace=ns.to_proto(), prompt=kv_pb2.Prompt(tokens=tokens),
                             region_id=region.id, mode=kv_pb2.LoadStart.MODE_IO_ONLY)
    assert not start.accept_loaded_batch
    requests = queue.SimpleQueue()
    requests.put(kv_pb2.LoadRequest(start=start))

    def send():
        while (request := requests.get()) is not None:
            yield request

    kinds, chunks = [], []
    for response in client._kv.Load(send(), timeout=60):
        kinds.append(response.WhichOneof("msg"))
        if kinds[-1] == "loaded":
            chunks.append(response.loaded.chunk)
        elif kinds[-1] == "done":
            requests.put(kv_pb2.LoadRequest(release=kv_pb2.LoadRelease()))
            requests.put(None)
    assert "loaded_batch" not in kinds
    assert kinds[0] == "plan" and kinds[-1] == "done" and sorted(chunks) == list(range(CHUNKS))


def test_the_client_can_ask_for_one_chunk_per_message(daemon):
    """Client(accept_loaded_batch=False): what clients before the field got (cake_bench.client_load measures its cost)."""
    with daemon.client(accept_loaded_batch=False) as client:
        ns = small_namespace("loaded-batch-off")
        tokens = prompt(256, seed=73)
        region = stored(client, ns, tokens, 256)
        with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
            assert sorted(e.chunk for e in load) == list(range(256))
            assert load.loaded_messages == 256
