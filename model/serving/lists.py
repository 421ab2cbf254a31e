"""shapeplan's own formats: a plain ``list`` of lengths, and ``json`` with shapes, batch sizes and named buckets.

No serving stack reads these directly; they are the neutral form a tool or a person
edits.  ``list`` is one length a line (or comma separated) with ``#`` comments;
``json`` is exactly ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}}``.
"""

from __future__ import annotations

from pathlib import Path

from model.base.errors import InputError
from model.serving.parse import MAX_BUCKET_NAMES, MAX_BUCKETS, parse_int, shown, text_lines
from model.serving.parse_json import JsonLineIndex, json_int_list, json_text, key_line, load_json_object
from model.serving.spec import ExportSpec, Given, contexts


def read_list(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``list``: lengths separated by commas or newlines; '#' comments; one trailing comma a line is fine."""
    src = str(path)
    out = []
    for number, body in text_lines(text, src):
        tokens = body.split(",")
        if len(tokens) > 1 and not tokens[-1].strip():
            tokens.pop()
        for token in tokens:
            out.append(Given(parse_int(token, src, number, "length"), src, number, "length"))
    return out


def read_json(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``json``: exactly ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}}``.

    At most MAX_BUCKET_NAMES named lists holding at most MAX_BUCKETS entries in all: each
    is read in full, so their number and size, like every other count in a
    configuration, are bounded.
    """
    src = str(path)
    top = load_json_object(text, src)
    for key in top:
        if key not in ("shapes", "batch_sizes", "buckets"):
            raise InputError(src, key_line(text, key), key, "unknown key (expected shapes, batch_sizes, buckets)")
    buckets = top.get("buckets", {})
    names = list(buckets) if isinstance(buckets, dict) and len(buckets) <= MAX_BUCKET_NAMES else []
    index = JsonLineIndex(text, ("shapes", "batch_sizes", "buckets", *names))
    shapes = json_int_list(index, src, top, "shapes", "")
    if "batch_sizes" in top and top["batch_sizes"] != []:
        json_int_list(index, src, top, "batch_sizes", "")
    if not isinstance(buckets, dict):
        raise InputError(src, index.key_line("buckets"), "buckets", f"expected an object of named lists, "
                         f"got {shown(buckets)}")
    if len(buckets) > MAX_BUCKET_NAMES:
        first_over = list(buckets)[MAX_BUCKET_NAMES]
        raise InputError(src, key_line(text, first_over), "buckets", f"{len(buckets)} named lists; at most "
                         f"{MAX_BUCKET_NAMES}")
    total = 0
    for name in names:
        size = len(buckets[name]) if isinstance(buckets[name], list) else 0
        if size <= MAX_BUCKETS < total + size:  # a list too long by itself gets json_int_list's message
            raise InputError(src, index.key_line(name), f"buckets.{name}", f"the named lists hold {total + size} "
                             f"entries up to this one; at most {MAX_BUCKETS} in all")
        total += size
        json_int_list(index, src, buckets, name, "buckets.")
    return shapes


def write_list(spec: ExportSpec) -> str:
    """``list``: a comment, then one shape a line."""
    return "# shapeplan export: compiled sequence lengths, one a line\n" + "".join(f"{s}\n" for s in spec.shapes)


def write_json(spec: ExportSpec) -> str:
    """``json``: shapes, the batch sizes used, and the context buckets when requests were given."""
    buckets = {"context": contexts(spec)} if spec.has_contexts else {}
    return json_text({"shapes": list(spec.shapes), "batch_sizes": list(spec.batch_sizes), "buckets": buckets})

