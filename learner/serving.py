"""The gRPC server around the learner's service: its address, threads, limits and admission.

One worker thread per actor stream (up to --max_actors, plus a few for side calls and for
refusing the streams beyond --max_actors with a message that says so), a message size
limit that the service itself enforces with a clear error (the transport's own cap is set
above it), TLS or mutual TLS, and the shared-token check (see `security`).
"""

from __future__ import annotations

import threading

import grpc

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.elastic_pool import ElasticThreadPool
from fleetrl.learner.security import TokenCheck, server_credentials, server_options
from fleetrl.learner.server import LearnerService, learner_handler
from fleetrl.proto.auth import read_token

# Threads beyond --max_actors' streams: side calls (GetStatus, GetRunInfo, GetEvalWork), and
# streams over the limit, which the service refuses at once with RESOURCE_EXHAUSTED naming
# --max_actors. Past all of them gRPC refuses calls itself ("Concurrent RPC limit exceeded").
SIDE_CALLS = 4
REFUSALS = 4


def max_calls(config: LearnerConfig) -> int:
    return config.max_actors + SIDE_CALLS + REFUSALS


class BindError(ValueError):
    """The learner cannot serve on its --bind address."""

    def __init__(self, bind: str, cause: BaseException | None = None):
        super().__init__(f"cannot serve on --bind={bind}: the port is in use (another learner?) or the address is "
                         f"not this machine's; choose another port, or port 0 for any free one"
                         + (f" ({cause})" if cause else ""))


class LearnerServer:
    def __init__(self, config: LearnerConfig, service: LearnerService):
        limit_bytes = config.max_message_mb * 1024 * 1024
        token = read_token(config.auth_token_file)
        # Who may join: with neither a token nor client certificates, anyone who reaches the address.
        self.authenticated = bool(token or config.tls_client_ca)
        self._server = grpc.server(
            # Threads a burst of calls started exit once idle: a flood leaves no threads behind.
            ElasticThreadPool(max_calls(config), thread_name_prefix="actor-stream"),
            maximum_concurrent_rpcs=max_calls(config),
            # Above the service's own limit, so that it, not the transport, rejects a big message.
            options=server_options(4 * limit_bytes, config.handshake_timeout_s),
            interceptors=[TokenCheck(token, service.count_rejection)] if token else [],
        )
        self._server.add_generic_rpc_handlers((learner_handler(service, limit_bytes),))
        try:
            if config.tls_cert or config.tls_key:
                credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
                port = self._server.add_secure_port(config.bind, credentials)
            else:
                if config.tls_client_ca:
                    raise ValueError("--tls_client_ca needs --tls_cert and --tls_key")
                port = self._server.add_insecure_port(config.bind)
        except RuntimeError as e:  # gRPC's "Failed to bind to address"
            raise BindError(config.bind, e) from None
        if port == 0 and not config.bind.startswith("unix:"):
            raise BindError(config.bind)
        # Where actors reach it: the bound port (port 0 picks one), or the unix socket.
        self.address = config.bind if config.bind.startswith("unix:") else f"{config.bind.rsplit(':', 1)[0]}:{port}"

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        """Stops accepting calls and ends those in flight after `grace` seconds; set when done."""
        return self._server.stop(grace)
