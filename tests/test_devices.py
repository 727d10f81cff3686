"""The tensor intrinsics' cheap import: the stack TVMScript sees, and what it leaves behind."""

import inspect

from calo import devices


def _both_stacks():
    return inspect.stack(), devices._cheap_stack()


def test_the_cheap_stack_gives_what_inspect_stack_gives():
    full, cheap = _both_stacks()
    assert len(cheap) == len(full) > 5
    for a, b in zip(full, cheap):
        assert (a.frame, a.filename, a.lineno, a.function) == (
            b.frame, b.filename, b.lineno, b.function)
        assert a.code_context == b.code_context  # what TVMScript reads: the decorator's line
    assert cheap[0].function == "_both_stacks"


def test_the_intrinsics_are_registered_and_inspect_is_left_as_it_was():
    from tvm.s_tir._tensor_intrin import TensorIntrin

    devices.preload_tensor_intrinsics()
    assert inspect.stack is not devices._cheap_stack
    assert inspect.stack.__module__ == "inspect"
    assert TensorIntrin.get("dot_16x4_vnni") is not None  # x86's, what a CPU search may use
