"""Compiled batch sizes as input: ``batch_buckets`` in a profile's [device] table or a scenario, ``--batch-buckets``
on the command lines, the graph caps, and the evaluator's rules for them (shared/cost_model.md, "Compiled batch
sizes (graphs) in device mode")."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO, bucket, cli, problem

from model import pipeline
from model.base.errors import InfeasibleError, InputError
from model.cost.device import DeviceProfile
from model.domain.shapeset import check_kv_fits
from model.load.profile import load_profile
from model.load.scenario import load_scenario

PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"
REQUESTS = [("a", 51, 19), ("b", 100, 53), ("c", 130, 20), ("d", 700, 300), ("e", 64, 16)]
PLAN = [("a", "b-2", 128), ("b", "b-2", 128), ("e", "b-10", 128), ("c", "b-3", 768), ("d", "b-3", 768)]


def write_example(tmp: Path) -> tuple[Path, Path]:
    """The worked example's five requests and plan as files."""
    reqs, plan = tmp / "reqs.jsonl", tmp / "plan.jsonl"
    reqs.write_text("".join(f'{{"request_id": "{r}", "prompt_len": {p}, "gen_len": {g}}}\n' for r, p, g in REQUESTS))
    plan.write_text("".join(f'{{"request_id": "{r}", "batch_id": "{b}", "shape": {{"seq_align": {s}, '
                            f'"heads_align": 32, "hidden_align": 4096}}}}\n' for r, b, s in PLAN))
    return reqs, plan


def profile_text(extra: str) -> str:
    return PROFILE.read_text().replace("[device]\n", f"[device]\n{extra}\n")


def test_a_profile_s_batch_buckets_make_graph_mode(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text(profile_text("batch_buckets = [1, 4]"))
    prof = load_profile(path)
    assert prof.batch_buckets == (1, 4)
    assert pipeline.load_problem(pipeline.InputSpec(files=(write_example(tmp_path)[0],), device=prof))[0] \
        .cost.compiles_graphs


@pytest.mark.parametrize("value, message", [
    ("[4, 2]", "strictly increasing, got 4 then 2"), ("[0, 2]", "positive integer, got 0"),
    ("[]", "at least one batch size"), ("[1, 2.5]", "positive integer, got 2.5"), ("[true]", "got true"),
    ("4", "must be a list"), ("[2, 2]", "strictly increasing"),
])
def test_bad_batch_buckets_in_a_profile_name_file_line_and_key(tmp_path: Path, value, message):
    path = tmp_path / "p.toml"
    path.write_text(profile_text(f"batch_buckets = {value}"))
    with pytest.raises(InputError) as err:
        load_profile(path)
    assert err.value.file == str(path) and err.value.field == "device.batch_buckets"
    assert err.value.line == path.read_text().splitlines().index(f"batch_buckets = {value}") + 1
    assert message in err.value.message


def scenario(tmp: Path, head: str) -> Path:
    reqs, _ = write_example(tmp)
    path = tmp / "s.toml"
    path.write_text(f'max_shapes = 4\n{head}\n\n[[bucket]]\nname = "reqs"\nrequests = "{reqs.name}"\n')
    return path


def test_a_scenario_s_batch_buckets_replace_the_profile_s(tmp_path: Path):
    (tmp_path / "p.toml").write_text(profile_text("batch_buckets = [1, 2]"))
    sc = load_scenario(scenario(tmp_path, 'device = "p.toml"\nbatch_buckets = [1, 4, 8]'))
    assert sc.cost.batch_buckets == (1, 4, 8)
    flagged, _ = pipeline.load_problem(pipeline.InputSpec(scenario=sc.path, batch_buckets=(2, 16)))
    assert flagged.cost.batch_buckets == (2, 16)  # the flag replaces the scenario's in turn


@pytest.mark.parametrize("head, message", [
    ("batch_buckets = [1, 4]", "in reference mode a batch's size is free"),
    ('device = "p.toml"\nbatch_buckets = [3, 1]', "strictly increasing"),
    ('device = "p.toml"\nbatch_buckets = "1,2"', "must be a list"),
])
def test_bad_batch_buckets_in_a_scenario_name_file_line_and_key(tmp_path: Path, head, message):
    (tmp_path / "p.toml").write_text(PROFILE.read_text())
    path = scenario(tmp_path, head)
    with pytest.raises(InputError) as err:
        load_scenario(path)
    assert (err.value.file, err.value.field) == (str(path), "batch_buckets")
    assert err.value.line == next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                                  if line.startswith("batch_buckets"))
    assert message in err.value.message


@pytest.mark.parametrize("argv, message", [
    (["--batch-buckets", "1,4"], "in reference mode a batch's size is free"),
    (["--device-profile", str(PROFILE), "--batch-buckets", "4,1"], "strictly increasing"),
    (["--device-profile", str(PROFILE), "--batch-buckets", "1,,4"], "like 1,2,4,8"),
    (["--device-profile", str(PROFILE), "--batch-buckets", "AUTO"], "like 1,2,4,8"),  # auto is lower case
    (["--device-profile", str(PROFILE), "--batch-buckets", "0,4"], "positive integers, got 0"),
    (["--device-profile", str(PROFILE), "--limit-graphs", "3"], "give --batch-buckets"),
    (["--device-profile", str(PROFILE), "--max-warmup-s", "60"], "give --batch-buckets"),
    (["--device-profile", str(PROFILE), "--batch-buckets", "1,4", "--limit-graphs", "0"], "positive integer"),
    (["--device-profile", str(PROFILE), "--batch-buckets", "1,4", "--max-warmup-s", "-1"], "non-negative"),
])
@pytest.mark.parametrize("command", ["model.solve", "model.evaluate", "model.sweep", "model.audit"])
def test_bad_graph_flags_exit_2_with_the_flag_named(tmp_path: Path, command, argv, message):
    reqs, plan = write_example(tmp_path)
    (tmp_path / "shapes.txt").write_text("128,768\n")
    files = [str(reqs), str(plan)] if command == "model.evaluate" else [str(reqs)]
    extra = ["--shapes-from", str(tmp_path / "shapes.txt")] if command == "model.audit" else []
    quiet = [] if command == "model.evaluate" else ["--quiet"]
    done = cli(command, *files, *argv, *extra, *quiet, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    flag = [a for a in argv if a in ("--batch-buckets", "--limit-graphs", "--max-warmup-s")][-1]
    assert f"error: {flag}:" in done.stderr and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_evaluate_judges_the_worked_example_with_batch_buckets(tmp_path: Path):
    reqs, plan = write_example(tmp_path)
    done = cli("model.evaluate", str(reqs), str(plan), "--device-profile", str(PROFILE), "--batch-buckets", "1,4",
               cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "68,573.0" in done.stdout and "2.5375" in done.stdout


def test_evaluate_names_a_batch_larger_than_every_bucket(tmp_path: Path):
    reqs, plan = write_example(tmp_path)
    done = cli("model.evaluate", str(reqs), str(plan), "--device-profile", str(PROFILE), "--batch-buckets", "1",
               cwd=tmp_path)
    assert done.returncode == 1
    assert (f"INVALID batch-buckets: {plan}:1: batch 'b-2' has 2 members, more than the largest batch bucket 1"
            in done.stdout), done.stdout


def test_evaluate_judges_the_graph_caps_across_buckets(tmp_path: Path):
    reqs, plan = write_example(tmp_path)
    base = [str(reqs), str(plan), "--device-profile", str(PROFILE), "--batch-buckets", "1,4"]
    assert cli("model.evaluate", *base, "--limit-graphs", "3", "--max-warmup-s", "60", cwd=tmp_path).returncode == 0
    done = cli("model.evaluate", *base, "--limit-graphs", "2", "--max-warmup-s", "59.9", cwd=tmp_path)
    assert done.returncode == 1
    assert "INVALID graph-cap: 3 distinct graphs (batch, shape) across all buckets ((1, 128), (4, 128), (4, 768)), " \
           "at most 2 allowed" in done.stdout
    assert "INVALID warm-up: warming up 3 graphs takes 60 s (20 s each), over the 59.9 s allowed" in done.stdout


def test_evaluate_applies_the_kv_rule_to_the_graph_s_rows(tmp_path: Path):
    reqs, plan = write_example(tmp_path)
    (tmp_path / "p.toml").write_text(PROFILE.read_text().replace("kv_capacity_tokens = 66144",
                                                                 "kv_capacity_tokens = 4000"))
    base = [str(reqs), str(plan), "--device-profile", str(tmp_path / "p.toml")]
    assert cli("model.evaluate", *base, cwd=tmp_path).returncode == 0  # 2 x (768 + 300) = 2136 fits
    done = cli("model.evaluate", *base, "--batch-buckets", "1,4", cwd=tmp_path)  # 4 x 1068 = 4272 does not
    assert done.returncode == 1
    assert "batch 'b-3' holds 4272 KV tokens (graph batch size x (seq_align + G_max)), over the device's " \
           "capacity 4000" in done.stdout


def test_a_request_whose_smallest_graph_overflows_the_kv_cache_is_a_proof():
    prof = DeviceProfile(name="t", prefill=(1.0, 0.0, 0.0), decode=(1.0, 0.0, 0.0), compile_ms=1.0,
                         kv_capacity_tokens=300, batch_buckets=(2, 4))
    prob = problem(bucket([100], [60]), mode="device", params=prof)  # 2 x (128 + 60) = 376 > 300
    with pytest.raises(InfeasibleError, match=r"2 x \(128 \+ gen_len 60\) KV tokens > the KV capacity 300"):
        check_kv_fits(prob)


def test_a_warm_up_cap_below_one_graph_is_a_proof(tmp_path: Path):
    reqs, _ = write_example(tmp_path)
    done = cli("model.solve", str(reqs), "--device-profile", str(PROFILE), "--batch-buckets", "1,4",
               "--max-warmup-s", "19", "--solver", "dpfill", "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 3
    assert "below one graph's compile time (20 s)" in done.stderr


def test_the_dask_engine_refuses_graphs(tmp_path: Path):
    done = cli("model.solve", "--engine", "dask", str(tmp_path), "--device-profile", str(PROFILE), "--batch-buckets",
               "1,4", cwd=tmp_path)
    assert done.returncode == 2 and "dask does not support --batch-buckets" in done.stderr


def test_the_tables_say_what_is_compiled_in_graph_mode(tmp_path: Path):
    reqs, plan = write_example(tmp_path)
    done = cli("model.evaluate", str(reqs), str(plan), "--device-profile", str(PROFILE), "--batch-buckets", "1,4",
               cwd=tmp_path)
    assert "bucket reqs: 5 requests, 3 batches, 2 shapes [128, 768], 3 graphs (warm-up 60 s)" in done.stdout
    assert "  graphs (batch bucket, shape): (1, 128), (4, 128), (4, 768); batch buckets 1, 4, 20 s to compile " \
           "each" in done.stdout
    assert "compiled graphs across all buckets: 3 graphs (warm-up 60 s)\n" in done.stdout


@pytest.mark.parametrize("argv, mode", [([], "reference"), (["--cost-model", "strict"], "strict"),
                                        (["--device-profile", str(PROFILE)], "device")])
def test_the_tables_say_the_batch_is_free_without_batch_buckets(tmp_path: Path, argv, mode):
    reqs, plan = write_example(tmp_path)
    done = cli("model.evaluate", str(reqs), str(plan), *argv, cwd=tmp_path)
    each = "20 s" if mode == "device" else "1.5 s"
    assert f"2 shapes [128, 768], 3 graphs (warm-up {'60' if mode == 'device' else '4.5'} s)" in done.stdout
    assert (f"  graphs: the batch is free in {mode} mode (no batch buckets): one graph per distinct (batch size, "
            f"shape) the plan runs, what a static-batch stack would compile, {each} to compile each") in done.stdout
    assert "compiled graphs across all buckets: 3 graphs" in done.stdout
    assert "(the batch is free: one per distinct batch size and shape)" in done.stdout
