"""vLLM's general plugin for Cake (entry point group "vllm.general_plugins", declared in pyproject.toml): registers
cake.vllm.CakeConnector with vLLM's connector factory by name, so a kv-transfer-config of
{"kv_connector": "CakeConnector", ...} works without "kv_connector_module_path". vLLM calls register() in each of
its processes, possibly more than once; it imports nothing of Cake's until vLLM creates the connector."""
import logging

log = logging.getLogger("vllm.cake")  # cake.vllm.log's logger, under vLLM's "vllm" (whose handler prints it)


def register():
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:  # a vLLM without the v1 connector factory: the module path still works
        log.info("this vLLM has no KVConnectorFactory: use kv_connector_module_path \"cake.vllm\"")
        return
    try:
        KVConnectorFactory.register_connector("CakeConnector", "cake.vllm", "CakeConnector")
    except ValueError:  # registered already (vLLM loads plugins once per process, but tests and forks may repeat)
        pass
