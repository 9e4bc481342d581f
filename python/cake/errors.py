"""The client's exceptions: CakeError, a gRPC status code and the daemon's message, and DeadlineExceeded, the one
every wait raises when the daemon stays silent past its deadline."""
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
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(details or "the daemon did not answer in time")
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


class DeadlineExceeded(CakeError, TimeoutError):
    """The daemon did not answer within a call's deadline, or a load's stream stayed silent past its timeout. Also a
    TimeoutError, which the load's waits raised before they had deadlines of their own: code catching that still
    works. A frozen daemon ends here, never in a wait without end."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, message)
