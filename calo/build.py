"""Build function for Meta-Schedule's LocalBuilder workers.

TVM's default build function imports ``tvm.s_tir.tensor_intrin`` in every fresh worker process,
which takes ~25 s and makes builds time out. Candidates here never use tensor intrinsics, so the
worker only lowers and compiles. This module must stay light: workers import it by reference.
"""

from typing import Any


def build(mod: Any, target: Any, _params: Any) -> Any:
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    from tvm.tirx import build as tir_build

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tir_build(mod, target=target)


def build_and_export(mod: Any, target: Any) -> str:
    """Build, then export to a tar for the runner; the returned path is what the runner loads."""
    import os
    import shutil
    import tempfile

    from tvm.support.tar import tar

    folder = tempfile.mkdtemp(prefix="calo-build-")
    artifact = os.path.join(folder, "mod." + tar.output_format)
    try:
        build(mod, target, None).export_library(artifact, fcompile=tar)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # a failed build leaves nothing behind
        raise
    return artifact
