"""The actor's channel to the learner: TLS or not, the auth token on every call, keepalive."""

from __future__ import annotations

import grpc

from fleetrl.proto.auth import METADATA_KEY, bearer

# Pings on an idle connection notice a vanished learner; the learner accepts one every 10 s.
KEEPALIVE_S = 30
KEEPALIVE_TIMEOUT_S = 10


class _WithToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._metadata = (METADATA_KEY, bearer(token))

    def _details(self, details):
        return _Details(details, list(details.metadata or []) + [self._metadata])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = getattr(details, "compression", None)


def learner_channel(address: str, max_message_bytes: int, token: str | None = None, tls_ca: str = "",
                    tls_cert: str = "", tls_key: str = "", tls_server_name: str = "") -> grpc.Channel:
    """A channel to `address`; TLS when a CA (or a client certificate, for mutual TLS) is given."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    if tls_ca or tls_cert:
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca), private_key=_read(tls_key), certificate_chain=_read(tls_cert))
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _WithToken(token)) if token else channel


def _read(path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None


def tls_mistake(details: str, address: str, tls_ca: str, tls_server_name: str) -> tuple[str, bool] | None:
    """What a failed connection's details say of a TLS setting, with the setting to check;
    and whether waiting cannot fix it. None: nothing about TLS (no learner there, say)."""
    if "Hostname Verification Check failed" in details or "Peer name" in details:
        name = f"--tls_server_name={tls_server_name}" if tls_server_name else f"the address's host ({address})"
        return (f"the learner's certificate does not name {name}: pass --tls_server_name=<a name its certificate "
                "holds>, or dial the learner by such a name"), True
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (f"the learner's certificate is not signed by --tls_ca={tls_ca}: pass the CA that signed it"), True
    if "WRONG_VERSION_NUMBER" in details:
        return (f"the learner at {address} does not speak TLS: drop --tls_ca (and --tls_cert/--tls_key), or start "
                "the learner with --tls_cert and --tls_key"), True
    if "Socket closed" in details and not tls_ca:
        # A TLS learner closes a plaintext connection at once; so may a learner that is stopping.
        return (f"the learner at {address} closed every connection at once: if it serves TLS, pass --tls_ca=<the "
                "CA that signed its certificate>"), False
    return None
