"""Reference/strict coefficients read from TOML: a ``--cost-params`` file or a scenario's ``[cost_model]`` table.

Reading files is the loaders' work, so the cost model (``model.cost.analytic``) holds
only the arithmetic; unknown keys and non-numeric, negative or non-finite values are
errors naming file, line and key, so a typo never silently falls back to the default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

from model.base.errors import InputError
from model.base.numbers import Where, read_count, read_number, shown
from model.cost.analytic import CostParams
from model.load.toml_lines import key_line, read_toml

MAX_HIDDEN = 2**20  # the hidden size multiplies lengths of up to 2**20 in float64 sums: far beyond any model


def cost_params_from_toml(path: str | Path) -> CostParams:
    """Override coefficients from a TOML file (top level or a ``[cost_model]`` table).

    Unknown keys and non-numeric, negative or non-finite values are errors naming
    file, line and key, so a typo never silently falls back to the default.
    """
    path = Path(path)
    text, data = read_toml(path)
    table = "cost_model" if isinstance(data.get("cost_model"), dict) else None
    return cost_params_from_mapping(data["cost_model"] if table else data, str(path),
                                    lambda key: key_line(text, key, table) or key_line(text, table or key))


def cost_params_from_mapping(data: dict, source: str, line_of: Callable[[str], int | None] | None = None,
                             prefix: str = "") -> CostParams:
    """Build parameters from a mapping, validating every key and value.

    ``line_of`` finds the line of a key in the source file; ``prefix`` is put before
    the key in messages (``cost_model.`` for a scenario's inline table).
    """
    known = {f.name: f.type for f in fields(CostParams)}
    values = {}
    for key, value in data.items():
        where = (source, line_of(key) if line_of else None, prefix + key)
        if key not in known:
            raise InputError(*where, "unknown cost-model coefficient")
        number = read_number(value, Where(*where), message="expected a finite non-negative number, got {got}")
        if key == "hidden":
            if number < 1 or number != int(number):
                raise InputError(*where, f"expected a positive integer, got {shown(value)}")
            values[key] = read_count(int(number), Where(*where), 1, MAX_HIDDEN,
                                     too_big="expected a positive integer up to {high}, got {got}")
        else:
            values[key] = number
    return replace(CostParams(), **values)
