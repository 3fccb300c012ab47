"""The checked-in completion scripts match the live flag surface, and bash's completes flags."""

import subprocess

import pytest
from conftest import ROOT

from mlxcel_py.completions import SCRIPTS


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_checked_in_scripts_are_in_sync(name):
    assert (ROOT / "completions" / name).read_text() == SCRIPTS[name](), "run `make completions`"


def test_bash_completes_subcommands_and_flags():
    script = ROOT / "completions" / "mlxcel.bash"
    probe = (
        f"source {script}; COMP_WORDS=(mlxcel generate --prompt-lookup-p); COMP_CWORD=2; _mlxcel; "
        "echo ${COMPREPLY[@]}; COMP_WORDS=(mlxcel se); COMP_CWORD=1; _mlxcel; echo ${COMPREPLY[@]}"
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "--prompt-lookup-policy"
    assert out[1] == "serve"
