"""The gRPC server around the learner's service: its event loop, address, limits and admission.

Every stream, the inference batchers and the idle-stream watchdog run on one asyncio event
loop (`grpc.aio`), on a thread this server owns; the learner's other threads talk to it
through `start` and `stop`. A stream costs a coroutine, not a thread, so a flood of idle
connections leaves nothing behind. Also: a message size limit that the service itself
enforces with a clear error (the transport's own cap is set above it), TLS or mutual TLS,
and the shared-token check (see `security`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import grpc

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.transport.security import TokenCheck, server_credentials, server_options
from fleetrl.learner.transport.server import LearnerService, learner_handler
from fleetrl.proto.auth import read_token

log = logging.getLogger(__name__)

LOOPBACK = ("127.", "localhost", "unix:", "[::1]")

# Calls beyond --max_actors' streams: side calls (GetStatus, GetRunInfo, GetEvalWork), and
# streams over the limit, which the service refuses at once with RESOURCE_EXHAUSTED naming
# --max_actors. Past all of them gRPC refuses calls itself ("Concurrent RPC limit exceeded").
SIDE_CALLS = 4
REFUSALS = 4


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def dialable_address(address: str) -> str:
    """`address` as other hosts can dial it: a wildcard bind ("0.0.0.0:8686", every interface)
    becomes this host's name, if that name resolves here (else its loopback address, which
    only this host can dial); any other address is returned as it is."""
    host, _, port = address.rpartition(":")
    if address.startswith("unix:") or host not in WILDCARD_HOSTS:
        return address
    name = socket.getfqdn()
    try:
        socket.getaddrinfo(name, int(port))
    except (OSError, ValueError):
        log.warning("serving on every interface (%s), but this host's name %r does not resolve: actors on other "
                    "hosts must dial one of its addresses", address, name)
        return f"127.0.0.1:{port}"
    return f"{name}:{port}"


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
        self.service = service
        token = read_token(config.auth_token_file)
        # Who may join: with neither a token nor client certificates, anyone who reaches the address.
        self.authenticated = bool(token or config.tls_client_ca)
        if not self.authenticated and not config.bind.startswith(LOOPBACK):  # however the learner was started
            log.warning("serving %s to other hosts without authentication: anyone who can reach this address can "
                        "join the run (set --auth_token_file or --tls_client_ca)", config.bind)
        if config.tls_client_ca and not (config.tls_cert or config.tls_key):
            raise ValueError("--tls_client_ca needs --tls_cert and --tls_key")
        credentials = (server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
                       if config.tls_cert or config.tls_key else None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="grpc-loop", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        try:
            self.address = self._on_loop(self._bind(config, token, credentials))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _bind(self, config: LearnerConfig, token: str, credentials: grpc.ServerCredentials | None) -> str:
        """The server, built on its loop (grpc.aio binds to the loop that builds it); where actors reach it."""
        limit_bytes = config.max_message_mb * 1024 * 1024
        self._server = grpc.aio.server(
            maximum_concurrent_rpcs=max_calls(config),
            # Above the service's own limit, so that it, not the transport, rejects a big message.
            options=server_options(4 * limit_bytes, config.handshake_timeout_s),
            interceptors=[TokenCheck(token, self.service.count_rejection)] if token else [],
        )
        self._server.add_generic_rpc_handlers((learner_handler(self.service, limit_bytes),))
        try:
            if credentials is not None:
                port = self._server.add_secure_port(config.bind, credentials)
            else:
                port = self._server.add_insecure_port(config.bind)
        except RuntimeError as e:  # gRPC's "Failed to bind to address"
            raise BindError(config.bind, e) from None
        if port == 0 and not config.bind.startswith("unix:"):
            raise BindError(config.bind)
        # The bound port (port 0 picks one), or the unix socket.
        return config.bind if config.bind.startswith("unix:") else f"{config.bind.rsplit(':', 1)[0]}:{port}"

    def start(self) -> None:
        """Starts serving, and the service's batchers with it."""
        self._on_loop(self._start())

    async def _start(self) -> None:
        await self.service.start()
        await self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        """Fails the steps waiting for inference (their streams end with the run's end), stops
        accepting calls, ends those in flight after `grace` seconds, and ends the loop; the
        event is set when all that is done. Safe to call twice, or without `start`."""
        if self._stopped.is_set() or not self._loop.is_running():
            self._stopped.set()
            return self._stopped
        self.service.stop_batchers()
        asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        return self._stopped

    async def _stop(self, grace: float | None) -> None:
        try:
            await self._server.stop(grace)
            await self.service.stop()
        finally:
            self._loop.stop()
            self._stopped.set()
