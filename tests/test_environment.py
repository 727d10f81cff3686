"""What a report says of where its figures came from."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import tvm

from calo.environment import ROOT, code_version, environment


def test_the_environment_names_this_machine_and_the_versions_in_use():
    env = environment()
    assert env["cpu"] == tvm.target.codegen.llvm_get_system_cpu()
    assert env["cores"] == os.cpu_count()
    assert env["packages"]["numpy"] == np.__version__
    assert all(env["packages"].values())  # every package of the stack is installed


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_a_report_names_the_commit_of_the_code_that_made_it():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    version = code_version()
    if head.returncode != 0:  # not a checkout
        assert version is None
    else:
        commit, _, rest = version.partition("+")
        assert commit == head.stdout.strip() and rest in ("", "changes")
