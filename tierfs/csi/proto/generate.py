"""``python -m tierfs.csi.proto.generate DIR``: write csi_pb2.py, .pyi and _grpc.py into DIR.

protoc runs on a copy of csi.proto placed at ``tierfs/csi/proto/csi.proto`` under a
temporary root, so the generated modules import each other as
``tierfs.csi.proto.csi_pb2`` wherever DIR is (the test generates into a temporary
directory and compares). Needs grpcio-tools (the test extra).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE = Path("tierfs", "csi", "proto")
OUTPUTS = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    includes = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / PACKAGE).mkdir(parents=True)
        shutil.copyfile(HERE / "csi.proto", root / PACKAGE / "csi.proto")
        out = root / "out"
        out.mkdir()
        status = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"-I{includes}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(root / PACKAGE / "csi.proto"),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in OUTPUTS:
            shutil.copyfile(out / PACKAGE / name, out_dir / name)
            written.append(out_dir / name)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1] if len(sys.argv) > 1 else HERE)):
        print(path)
