"""How the learner's gRPC server admits callers: TLS, a shared token, size limits, keepalive.

- TLS from a certificate and key; with a client CA, callers must present a certificate it
  signed (mutual TLS), checked by gRPC during the TLS handshake.
- A shared token (`fleetrl.proto.auth`): `TokenCheck` rejects a call without the right
  one with UNAUTHENTICATED before its handler runs, comparing in constant time.
- Keepalive pings, so the learner notices half-open connections from vanished hosts.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import grpc

from fleetrl.proto.auth import METADATA_KEY, bearer

# Seconds between keepalive pings on idle connections, and how long a ping may go unanswered.
KEEPALIVE_S = 20
KEEPALIVE_TIMEOUT_S = 10


def server_options(transport_limit_bytes: int, handshake_timeout_s: float = 10.0) -> list[tuple[str, int]]:
    return [
        # A connection that has not finished its TLS and HTTP/2 handshakes by then is closed:
        # idle sockets must not pile up (a stream's own Handshake message has the same limit).
        ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
        ("grpc.max_receive_message_length", transport_limit_bytes),
        ("grpc.max_send_message_length", transport_limit_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        # Actors ping every 30 s; allow it without calling that abuse.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # gRPC's default SO_REUSEPORT would let a second learner bind a live one's port and
        # take half the fleet; without it the second fails at start with "address in use".
        ("grpc.so_reuseport", 0),
    ]


def server_credentials(cert_file: str, key_file: str, client_ca_file: str = "") -> grpc.ServerCredentials:
    def read(path: str, what: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"cannot read the {what} {path}: {e.strerror}") from None

    pair = (read(key_file, "TLS key"), read(cert_file, "TLS certificate"))
    client_ca = read(client_ca_file, "client CA") if client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


class TokenCheck(grpc.aio.ServerInterceptor):
    """Lets a call through only with `authorization: Bearer <token>` in its metadata."""

    def __init__(self, token: str, on_reject: Callable[[str, str], None] = lambda kind, message: None):
        self._expected = bearer(token).encode()
        self._on_reject = on_reject

    async def intercept_service(self, continuation, handler_call_details):
        supplied = dict(handler_call_details.invocation_metadata).get(METADATA_KEY, "")
        supplied = supplied.encode() if isinstance(supplied, str) else supplied
        if hmac.compare_digest(supplied, self._expected):
            return await continuation(handler_call_details)
        self._on_reject("UNAUTHENTICATED", f"a call to {handler_call_details.method} without the run's auth token "
                                           "(--auth_token_file)")
        handler = await continuation(handler_call_details)
        if handler is None:
            return None

        async def deny(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)
