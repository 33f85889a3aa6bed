"""Who may talk to the learner: the shared token, TLS and mutual TLS, with certificates made here."""

import datetime
import ipaddress
import threading

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.channel import learner_channel
from fleetrl.actor.config import ActorConfig
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc


def certificate(name: str, issuer=None, is_ca=False, names=("localhost", "127.0.0.1")):
    """A key and a certificate for `name`, signed by `issuer` (a key, certificate pair) or
    self-signed; a server's names (DNS names and IP addresses) in its subject alternative names."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_key, signer_cert = issuer or (key, None)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(signer_cert.subject if signer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if not is_ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [_alternative_name(n) for n in names]), critical=False)
    return key, builder.sign(signer_key, hashes.SHA256())


def _alternative_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def write_pem(directory, name, key, cert):
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.crt"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA that signs the learner and a good client; a stranger's CA that signs another client."""
    directory = tmp_path_factory.mktemp("pki")
    ca = certificate("fleetrl test CA", is_ca=True)
    stranger_ca = certificate("stranger CA", is_ca=True)
    files = {"ca": write_pem(directory, "ca", *ca)[1]}
    files["server_key"], files["server_cert"] = write_pem(directory, "server", *certificate("localhost", ca))
    files["client_key"], files["client_cert"] = write_pem(directory, "client", *certificate("actor", ca))
    files["stranger_key"], files["stranger_cert"] = write_pem(directory, "stranger",
                                                              *certificate("actor", stranger_ca))
    files["elsewhere_key"], files["elsewhere_cert"] = write_pem(
        directory, "elsewhere", *certificate("learner.example", ca, names=("learner.example",)))
    return files


def status(channel) -> grpc.StatusCode:
    try:
        pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def test_calls_without_the_right_token_are_unauthenticated(tmp_path, running_learner):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    with running_learner(tmp_path, auth_token_file=str(token_file)) as learner:
        address = learner.address
        assert status(learner_channel(address, 1 << 20)) == grpc.StatusCode.UNAUTHENTICATED
        assert status(learner_channel(address, 1 << 20, token="wrong")) == grpc.StatusCode.UNAUTHENTICATED
        assert status(learner_channel(address, 1 << 20, token="s3cret-token")) == grpc.StatusCode.OK
        # The stream is guarded too: an actor with a wrong token is refused for good, not retried.
        with pytest.raises(ActorError, match="UNAUTHENTICATED"):
            Actor(ActorConfig(learner_address=address, num_envs=2, actor_id="intruder")).run(max_steps=3)
        assert learner.service.rejected_messages >= 3
        actor = Actor(ActorConfig(learner_address=address, num_envs=2, actor_id="member",
                                  auth_token_file=str(token_file)))
        actor.run(max_steps=5)
        assert actor.steps_sent == 5


def test_mutual_tls_admits_only_clients_signed_by_the_client_ca(tmp_path, pki, running_learner):
    with running_learner(tmp_path, tls_cert=pki["server_cert"], tls_key=pki["server_key"],
                         tls_client_ca=pki["ca"]) as learner:
        address = learner.address
        good = dict(tls_ca=pki["ca"], tls_cert=pki["client_cert"], tls_key=pki["client_key"])
        assert status(learner_channel(address, 1 << 20, **good)) == grpc.StatusCode.OK
        stranger = dict(tls_ca=pki["ca"], tls_cert=pki["stranger_cert"], tls_key=pki["stranger_key"])
        assert status(learner_channel(address, 1 << 20, **stranger)) == grpc.StatusCode.UNAVAILABLE
        assert status(learner_channel(address, 1 << 20, tls_ca=pki["ca"])) == grpc.StatusCode.UNAVAILABLE
        assert status(learner_channel(address, 1 << 20)) == grpc.StatusCode.UNAVAILABLE  # plaintext
        actor = Actor(ActorConfig(learner_address=address, num_envs=2, actor_id="tls-actor", **good))
        actor.run(max_steps=5)
        assert actor.steps_sent == 5


def test_tls_without_client_certificates_still_encrypts_and_checks_the_server(tmp_path, pki, running_learner):
    with running_learner(tmp_path, tls_cert=pki["server_cert"], tls_key=pki["server_key"]) as learner:
        assert status(learner_channel(learner.address, 1 << 20, tls_ca=pki["ca"])) == grpc.StatusCode.OK
        # A client that trusts another CA refuses this server.
        assert status(learner_channel(learner.address, 1 << 20, tls_ca=pki["stranger_cert"])) == \
            grpc.StatusCode.UNAVAILABLE


def test_a_connection_that_never_sends_its_handshake_is_dropped(tmp_path, running_learner):
    with running_learner(tmp_path, handshake_timeout_s=1.0) as learner:
        channel = grpc.insecure_channel(learner.address)
        held = threading.Event()

        def silent():
            held.wait(10)
            return
            yield

        responses = pb_grpc.LearnerStub(channel).Stream(silent())
        with pytest.raises(grpc.RpcError) as info:
            next(responses)
        held.set()
        channel.close()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no handshake within 1 s" in info.value.details() and "--handshake_timeout_s" in info.value.details()
        assert learner.service.rejected_messages == 1


def test_tls_mistakes_are_named_with_the_setting_to_check(tmp_path, pki, running_learner):
    """Each used to read "no learner answered ... is one running there?"."""
    def refusal(address, **tls) -> str:
        actor = Actor(ActorConfig(learner_address=address, num_envs=2, actor_id="a", max_reconnect_s=1.0, **tls))
        with pytest.raises(ActorError) as info:
            actor.run(max_steps=1)
        return str(info.value)

    with running_learner(tmp_path / "a", tls_cert=pki["server_cert"], tls_key=pki["server_key"]) as learner:
        message = refusal(learner.address)  # no --tls_ca against a TLS learner
        assert "if it serves TLS, pass --tls_ca=" in message and "no learner answered" not in message
        assert "not signed by --tls_ca" in refusal(learner.address, tls_ca=pki["stranger_cert"])
    with running_learner(tmp_path / "b", tls_cert=pki["elsewhere_cert"], tls_key=pki["elsewhere_key"]) as learner:
        message = refusal(learner.address, tls_ca=pki["ca"])  # its certificate names learner.example only
        assert "certificate does not name" in message and "--tls_server_name" in message
        actor = Actor(ActorConfig(learner_address=learner.address, num_envs=2, actor_id="b", tls_ca=pki["ca"],
                                  tls_server_name="learner.example"))
        actor.run(max_steps=3)
        assert actor.steps_sent == 3
    with running_learner(tmp_path / "c") as learner:  # plaintext
        assert "does not speak TLS: drop --tls_ca" in refusal(learner.address, tls_ca=pki["ca"])


def test_the_deployment_docs_certificate_recipe_makes_a_working_mutual_tls_setup(tmp_path, running_learner, repo_root):
    """docs/deployment.md's OpenSSL commands, run as printed: the learner serves mutual TLS with
    their files, an actor with the client certificate trains, one without it is refused."""
    import re
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: the recipe in docs/deployment.md needs it")
    text = (repo_root / "docs" / "deployment.md").read_text()
    block = re.search(r"<!-- tls-recipe -->\s*```sh\n(.*?)```", text, re.S).group(1)
    script = "\n".join(line.strip() for line in block.splitlines())
    result = subprocess.run(["sh", "-e", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    files = {name: str(tmp_path / name) for name in ("ca.crt", "learner.crt", "learner.key", "actor.crt", "actor.key")}
    with running_learner(tmp_path / "run", tls_cert=files["learner.crt"], tls_key=files["learner.key"],
                         tls_client_ca=files["ca.crt"]) as learner:
        actor = Actor(ActorConfig(learner_address=learner.address, num_envs=2, actor_id="docs",
                                  tls_ca=files["ca.crt"], tls_cert=files["actor.crt"], tls_key=files["actor.key"]))
        actor.run(max_steps=3)
        assert actor.steps_sent == 3
        assert status(learner_channel(learner.address, 1 << 20, tls_ca=files["ca.crt"])) == grpc.StatusCode.UNAVAILABLE
