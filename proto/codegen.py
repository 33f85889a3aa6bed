"""Regenerates the gRPC Python code from proto/learner.proto.

The repository root is the package `fleetrl`, but its folder may have any name. protoc
derives import paths from the include root, so we compile through a temporary folder
where a link named `fleetrl` points at the repository: the generated code then says
`from fleetrl.proto import learner_pb2`.

    python -m fleetrl.proto.codegen            # rewrite the committed files
    python -m fleetrl.proto.codegen --out DIR  # write them elsewhere (the staleness test)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "learner.proto"
GENERATED = ("learner_pb2.py", "learner_pb2.pyi", "learner_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc  # dev dependency, only needed here

    repo_root = PROTO_DIR.parent
    with tempfile.TemporaryDirectory() as tmp:
        include = pathlib.Path(tmp) / "include"
        include.mkdir()
        os.symlink(repo_root, include / "fleetrl")
        staging = pathlib.Path(tmp) / "out"
        staging.mkdir()
        import grpc_tools

        well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{include}",
            f"-I{well_known}",
            f"--python_out={staging}",
            f"--pyi_out={staging}",
            f"--grpc_python_out={staging}",
            f"fleetrl/proto/{PROTO_FILE}",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_FILE}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            (out_dir / name).write_bytes((staging / "fleetrl" / "proto" / name).read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=PROTO_DIR)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
