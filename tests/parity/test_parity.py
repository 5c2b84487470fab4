"""``dlm parity``: every public fixture's reference runs come out of the engine exactly, and a
mismatch is reported and fails the command."""

import json
import shutil

import pytest
from helpers import FIXTURES

from dlm_backend.cli import main as dlm
from dlm_backend.parity import check_fixture

PUBLIC = [FIXTURES / "parity" / "llada-tiny", FIXTURES / "parity" / "dream-tiny",
          FIXTURES / "parity-block" / "llada2-tiny", FIXTURES / "parity-block" / "sdar-tiny",
          FIXTURES / "parity-block" / "fastdllm2-tiny"]


@pytest.mark.parametrize("folder", PUBLIC, ids=lambda p: p.name)
def test_every_case_of_a_public_fixture_is_exact(folder):
    results = check_fixture(folder)
    cases = json.loads((folder / "cases.json").read_text())["cases"]
    assert sum(not r.name.startswith("forward") for r in results) == len(cases)
    assert any(r.name.startswith("forward") for r in results)
    assert [r.line() for r in results if not r.ok] == []


def test_sampled_cases_also_pass_with_the_recorded_draws():
    results = check_fixture(FIXTURES / "parity-block" / "fastdllm2-tiny", replay=True)
    replayed = [r for r in results if "replayed draws" in r.note]
    assert len(replayed) == 2 and all(r.ok for r in results)


def test_the_command_prints_a_line_per_case_and_the_count(capsys):
    assert dlm(["parity", str(FIXTURES / "parity-block" / "sdar-tiny")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{len(lines) - 1}/{len(lines) - 1} cases exact"
    assert all(line.startswith("ok   sdar-tiny: ") for line in lines[:-1])


def test_a_mismatch_fails_the_command_and_says_where(tmp_path, capsys):
    folder = shutil.copytree(FIXTURES / "parity-block" / "llada2-tiny", tmp_path / "llada2-tiny")
    cases = json.loads((folder / "cases.json").read_text())
    cases["cases"][3]["output"][2] += 1                   # the reference "said" another token
    cases["cases"][5]["nfe"] += 1                          # ... and another forward count
    cases["cases"] = cases["cases"][:6]
    (folder / "cases.json").write_text(json.dumps(cases))
    assert dlm(["parity", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "FAIL llada2-tiny: #3 " in out and "tokens: got" in out
    assert "FAIL llada2-tiny: #5 " in out and "passes: got" in out
    assert out.splitlines()[-1].startswith(f"{len(out.splitlines()) - 3}/")


def test_an_unknown_reference_sampler_is_a_failure_not_a_skip(tmp_path):
    folder = shutil.copytree(FIXTURES / "parity-block" / "sdar-tiny", tmp_path / "sdar")
    cases = json.loads((folder / "cases.json").read_text())
    cases["cases"] = [{**cases["cases"][0], "sampler": "someone.generate"}]
    (folder / "cases.json").write_text(json.dumps(cases))
    bad = [r for r in check_fixture(folder) if not r.ok]
    assert [r.errors for r in bad] == [["no engine mapping for reference sampler 'someone.generate'"]]


def test_a_folder_without_cases_is_a_clear_error(tmp_path, capsys):
    assert dlm(["parity", str(tmp_path)]) == 2
    assert "no cases.json" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("folder", PUBLIC, ids=lambda p: p.name)
def test_every_public_fixture_is_exact_on_cuda_with_the_kernels(folder):
    """float32 on CUDA: the paged-attention, fused-MoE and unmasking kernels run (DLM_KERNELS=auto)."""
    assert [r.line() for r in check_fixture(folder, device="cuda") if not r.ok] == []
