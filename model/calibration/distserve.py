"""DistServe's published profile JSON taken as a device profile (its coefficients are already fitted).

DistServe (LLMServe/DistServe, ``simdistserve/estimators/profile_data/*.json``) keeps, per
model and tensor-parallel degree, ``prefill = [a, b, c]`` of ``a + b*sum(len) + c*sum(len^2)``
over the prompts of a prefill batch, ``decoding_smallbs`` and ``decoding_largebs = [a, b,
c]`` of one decode step ``a + b*sum(tokens) + c*batch``, the large-batch line from
``decoding_large_small_bs_threshold`` requests on, all in ms
(``simdistserve/estimators/time_estimator.py``).  Onto our profile's terms:

- prefill of n prompts padded to s: sum(len) = n*s and sum(len^2) = n*s^2, so
  (p0, p1, p2) = (a, b, c) exactly -- assuming a pad token costs what a real one does
  (DistServe's GPU runs do not pad; a static graph does);
- decode: (d0, d1, d2) = decoding_smallbs and decode_large = decoding_largebs from
  ``decode_large_from`` = the threshold, exactly (small when batch < threshold) --
  assuming ``sum(tokens)`` counts each request's context (prompt plus tokens so far), the
  reading the shared example profile uses;
- not in the file: compile time (a GPU compiles nothing; assumed or ``--compile-ms``), the
  KV capacity (DistServe keeps it in ``max_num_tokens.csv``; ``--kv-capacity-tokens``) and
  pipeline parallelism (the coefficients are at one stage; DistServe divides by the stages).

Our profile holds non-negative coefficients (a step never gets faster with more work), so a
fitted negative one -- the file has some for OPT-175B -- is refused, naming its line.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.base.errors import InputError
from model.calibration.json_text import finite_number, key_line
from model.cost.device import DeviceProfile

KEYS = ("prefill", "decoding_smallbs", "decoding_largebs", "decoding_large_small_bs_threshold")
MAX_COEFF = 1e12  # what a profile may hold (model.load.profile's bound)
MAX_THRESHOLD = 2**53


def looks_like_profile(data: dict) -> bool:
    """True if a JSON object is DistServe's model -> TP -> coefficients layout."""
    return bool(data) and all(isinstance(by_tp, dict) and by_tp and all(
        isinstance(entry, dict) and "prefill" in entry and "decoding_smallbs" in entry for entry in by_tp.values())
        for by_tp in data.values())


@dataclass(frozen=True)
class DistServeEntry:
    """The coefficients of one model at one tensor-parallel degree, with what was assumed to use them."""

    model: str
    tp: str
    profile: DeviceProfile
    notes: tuple[str, ...]


def _choose(options: list[str], given: str | None, flag: str, what: str, source: str, line: int | None) -> str:
    """The one option, or the one the flag names; else an error listing them."""
    if given is None and len(options) == 1:
        return options[0]
    listed = ", ".join(options)
    if given is None:
        raise InputError(source, line, None, f"holds {len(options)} {what}: choose one with {flag} "
                         f"(one of {listed})")
    if given not in options:
        raise InputError(flag, None, None, f"{given!r} is not in {source} (one of {listed})")
    return given


def _coefficients(entry: dict, key: str, text: str, source: str, path: tuple[str, ...]) -> tuple[float, ...]:
    line = key_line(text, (*path, key))
    field = f"{'.'.join(path)}.{key}"
    if key not in entry:
        raise InputError(source, key_line(text, path), field, "missing")
    value = entry[key]
    numbers = [finite_number(v) for v in value] if isinstance(value, list) else []
    if len(numbers) != 3 or None in numbers:
        raise InputError(source, line, field, f"expected a list of 3 finite numbers, got {value!r}")
    for name, number in zip(("a (the fixed ms)", "b (ms a token)", "c (the third term)"), numbers, strict=True):
        assert number is not None
        if number < 0:
            raise InputError(source, line, field, f"coefficient {name} is negative ({number!r}): a profile needs "
                             "non-negative step times (a step never gets faster with more work); choose another "
                             "--tp or fit measurements instead")
        if number > MAX_COEFF:
            raise InputError(source, line, field, f"coefficient {name} is {number:g}, above {MAX_COEFF:g}: a unit "
                             "mistake")
    return tuple(float(n) for n in numbers if n is not None)


def read_entry(text: str, data: dict, source: str, model: str | None, tp: str | None, compile_ms: float,
               kv_capacity_tokens: int | None, name: str | None) -> DistServeEntry:
    """The chosen model and TP of a DistServe profile file as our DeviceProfile, with its assumptions."""
    chosen = _choose(sorted(data), model, "--model", "models", source, 1)
    by_tp = data[chosen]
    degree = _choose(sorted(by_tp, key=lambda k: (len(k), k)), tp, "--tp", f"tensor-parallel degrees of {chosen}",
                     source, key_line(text, (chosen,)))
    entry = by_tp[degree]
    path = (chosen, degree)
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise InputError(source, key_line(text, (*path, unknown[0])), f"{chosen}.{degree}.{unknown[0]}",
                         f"unknown key (expected {', '.join(KEYS)})")
    prefill = _coefficients(entry, "prefill", text, source, path)
    small = _coefficients(entry, "decoding_smallbs", text, source, path)
    large = _coefficients(entry, "decoding_largebs", text, source, path) if "decoding_largebs" in entry else None
    threshold = entry.get("decoding_large_small_bs_threshold")
    if large is not None:
        field = f"{chosen}.{degree}.decoding_large_small_bs_threshold"
        if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= MAX_THRESHOLD:
            raise InputError(source, key_line(text, (*path, "decoding_large_small_bs_threshold")) or
                             key_line(text, path), field, f"must be a positive integer (the first batch size of "
                             f"decoding_largebs), got {threshold!r}")
    profile = DeviceProfile(
        name=name if name is not None else f"{chosen} / TP{degree} (DistServe fit)",
        prefill=prefill, decode=small, decode_large=large, decode_large_from=threshold if large else None,
        compile_ms=compile_ms, kv_capacity_tokens=kv_capacity_tokens)
    notes = (
        f"DistServe profile {chosen}, tensor parallel {degree}: coefficients taken as given, not fitted here",
        "prefill = DistServe's [a, b, c] of a + b*sum(len) + c*sum(len^2): exact for n prompts padded to s, "
        "ASSUMING a pad token costs what a real token does (DistServe's GPU runs do not pad)",
        "decode = decoding_smallbs, decode_large = decoding_largebs from batch size "
        f"{threshold} (DistServe's threshold): ASSUMING sum(tokens) counts each request's context" if large else
        "decode = decoding_smallbs (no large-batch line in the file): ASSUMING sum(tokens) counts each context",
        "pipeline parallelism: none (the coefficients are of one stage)",
    )
    return DistServeEntry(chosen, degree, profile, notes)
