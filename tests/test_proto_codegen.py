"""The committed gRPC code is what `make proto` generates from proto/learner.proto."""

import pathlib
import re

from fleetrl.proto import codegen


def test_generated_code_is_up_to_date(tmp_path):
    codegen.generate(tmp_path)
    for name in codegen.GENERATED:
        committed = (codegen.PROTO_DIR / name).read_text()
        fresh = (tmp_path / name).read_text()
        assert committed == fresh, f"proto/{name} is stale: run `make proto` and commit the result"


def test_no_pickle_in_the_wire_path():
    root = pathlib.Path(codegen.PROTO_DIR).parent
    for folder in ("proto", "learner", "actor", "launch"):
        for path in (root / folder).glob("*.py"):
            unsafe = r"import (cloud)?pickle|pickle\.loads?\(|marshal\.loads?\(|(?<![.\w])eval\("
            assert not re.search(unsafe, path.read_text()), f"{path} unpickles or evaluates data"
