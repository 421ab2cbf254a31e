"""Plans made with batch buckets export and check exactly: a batch of n runs in graph (B, s), B its bucket, so the
export writes (B, s) -- not (n, s) -- and ``model.export --check`` compares against the same graphs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import bucket
from test_graph_export import PROFILE, write_case

from model import export
from model.base.errors import InputError
from model.domain.schema import Plan
from model.serving.plan_use import shape_uses


def plan_of(sizes: list[int], shape: int) -> Plan:
    ids = [f"r{i}" for i in range(sum(sizes))]
    batch = [f"b{b}" for b, n in enumerate(sizes) for _ in range(n)]
    return Plan(np.array(ids, dtype=object), np.array(batch, dtype=object), np.full(len(ids), shape, np.int64))


def test_shape_uses_maps_each_batch_to_its_bucket_and_keeps_the_longest_context():
    plan = plan_of([2, 3, 1], 256)
    reqs = bucket([200] * 6, [10, 50, 5, 5, 90, 7], name="r")
    reqs = type(reqs)(reqs.name, reqs.source, np.array([f"r{i}" for i in range(6)], dtype=object),
                      reqs.prompt_len, reqs.gen_len, reqs.lines)
    free = shape_uses([plan], [reqs])
    assert free[0].batch_sizes == (1, 2, 3)
    graphs = shape_uses([plan], [reqs], (1, 4))
    assert graphs[0].batch_sizes == (1, 4) and graphs[0].contexts == (256 + 7, 256 + 90)
    with pytest.raises(InputError, match="larger than every batch bucket"):
        shape_uses([plan], [reqs], (1, 2))


@pytest.mark.parametrize("fmt, buckets", [("gaudi-file", "1,4"), ("json", "1,4"), ("nxdi", "4")])
def test_an_export_of_bucket_plans_checks_exactly_with_the_same_buckets(tmp_path, fmt, buckets, capsys):
    # nxdi compiles one batch size per graph kind: its plans run one bucket
    plans, req = write_case(tmp_path, [(256, 2, 200, 30), (256, 3, 180, 20), (1024, 1, 900, 40)])
    out = tmp_path / f"config.{fmt}"
    common = ["--requests", str(req), "--device-profile", str(PROFILE), "--batch-buckets", buckets]
    assert export.main(["--plans", str(plans), "--format", fmt, "--out", str(out), *common]) == 0
    assert f"batch sizes [{buckets.replace(',', ', ')}]" in capsys.readouterr().out
    assert export.main(["--check", str(out), "--format", fmt, "--plans", str(plans), *common]) == 0
    assert "OK" in capsys.readouterr().out
    # read against each batch's own size instead, the graphs differ: the (4, 256) graph is not (2, 256), (3, 256)
    assert export.main(["--check", str(out), "--format", fmt, "--plans", str(plans), "--requests", str(req)]) == 1


def test_auto_is_no_list_for_an_export(tmp_path):
    plans, req = write_case(tmp_path, [(256, 2, 200, 30)])
    with pytest.raises(InputError, match="auto chooses the buckets while planning"):
        export.main(["--plans", str(plans), "--format", "json", "--out", str(tmp_path / "x.json"),
                     "--batch-buckets", "auto"])
    assert not (tmp_path / "x.json").exists()
