"""What the connector's scheduler half hands its worker half each step (vLLM pickles it from one process to the
other), and vLLM's connector base classes, or plain stand-ins where vLLM is not installed."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from cake.split import SplitStep

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   KVConnectorRole)
except ImportError:  # tests, and machines without vLLM: the same methods on plain bases
    KVConnectorBase_V1 = object
    KVConnectorMetadata = object

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1


@dataclass
class LoadSpec:
    """One request's load: its prompt's tokens through the cached chunks, the tokens [start, end) to put into
    `block_ids` (start is vLLM's own prefix hit), whether vLLM waits for it asynchronously, and the request's
    namespace suffix (LoRA, cache salt) beyond the model's."""
    request_id: str
    tokens: list
    block_ids: list
    start: int
    end: int
    is_async: bool
    model_id: str = ""


@dataclass
class StoreSpec:
    """One finished request's store: the prompt's computed full chunks and the blocks holding them. ranges: the
    chunk ranges [first, end) to store (None: all of tokens' full chunks); a split request stores only the chunks
    it computed, not those spliced in from the cache."""
    request_id: str
    tokens: list
    block_ids: list
    model_id: str = ""
    ranges: Optional[list] = None


@dataclass
class SplitMetadata:
    """The split's part of CakeConnectorMetadata: the book's step, and what a worker needs to open each started
    load (the prompt's tokens up to H and the request's namespace, by load key)."""
    step: SplitStep = field(default_factory=SplitStep)
    prompts: dict = field(default_factory=dict)  # LoadKey -> (tokens tuple, model_id)


@dataclass
class CakeConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)
    split: Optional[SplitMetadata] = None  # in split mode, on steps with something to do
