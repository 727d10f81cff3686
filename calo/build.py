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


def artifact_folder() -> str:
    """A new temporary folder for one build's artifact."""
    import tempfile

    return tempfile.mkdtemp(prefix="calo-build-")


def build_and_export(mod: Any, target: Any, folder: str | None = None) -> str:
    """Build, then export to a tar for the runner; the returned path is what the runner loads.
    `folder`: the caller's artifact_folder(), which the caller then owns whatever happens here
    (a worker killed on a build timeout cleans up nothing); else a new one, removed if the
    build fails. TVM's own temporary files of the build (its object files) go in the folder
    too, so removing it removes everything a killed build wrote."""
    import os
    import shutil
    import tempfile

    from tvm.support.tar import tar

    own = folder is None
    folder = folder or artifact_folder()
    artifact = os.path.join(folder, "mod." + tar.output_format)
    before, tempfile.tempdir = tempfile.tempdir, folder
    try:
        build(mod, target, None).export_library(artifact, fcompile=tar)
    except BaseException:
        if own:
            shutil.rmtree(folder, ignore_errors=True)  # a failed build leaves nothing behind
        raise
    finally:
        tempfile.tempdir = before
    return artifact
