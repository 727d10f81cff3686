"""Build function for Meta-Schedule's LocalBuilder workers.

TVM's default build function imports ``tvm.s_tir.tensor_intrin`` in every fresh worker process,
which takes ~25 s and makes builds time out. Candidates here never use tensor intrinsics, so the
worker only lowers and compiles. This module must stay light: workers import it by reference.
"""

from typing import Any


def build(mod: Any, target: Any, _params: Any) -> Any:
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)
