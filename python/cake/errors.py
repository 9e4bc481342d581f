"""The one exception type of the client: a gRPC status code and the daemon's message."""
import grpc


class CakeError(Exception):
    """A call the daemon refused or could not serve. `code` is a grpc.StatusCode; `message` is the daemon's text,
    which names the field and what is accepted (docs/protocol.md lists every code per call)."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error):
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
