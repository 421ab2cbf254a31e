"""shapeplan's own formats: a plain ``list`` of lengths, and ``json`` with shapes, batch sizes and named buckets.

No serving stack reads these directly; they are the neutral form a tool or a person
edits.  ``list`` is one length a line (or comma separated) with ``#`` comments: its
graphs are its shapes, the batch left free.  ``json`` is exactly ``{"comment": "...", "shapes": [...],
"batch_sizes": [...], "buckets": {name: [...]}, "graphs": {"prompt": [[batch, shape],
...], "decode": [[batch, context bucket], ...]}}``, the graphs optional (without them a
json's graphs are its shapes, like a list's).
"""

from __future__ import annotations

from pathlib import Path

from model.base.errors import InputError
from model.serving.graphs import FREE_BATCH_NOTE, Compiled, Graph, count_text, graph_set
from model.serving.parse import MAX_BUCKET_NAMES, MAX_BUCKETS, check_range, parse_int, shown, text_lines
from model.serving.parse_json import JsonLineIndex, json_int_list, json_text, key_line, load_json_object
from model.serving.settings import Settings
from model.serving.spec import ExportSpec, Given, context_bucket, contexts

GRAPH_KINDS = ("prompt", "decode")


def shape_graphs(lengths: list[Given]) -> tuple[Graph, ...]:
    """A list of shapes as graphs: one per shape, the batch free."""
    return graph_set(Graph("shape", (g.value,)) for g in lengths)


def compile_list(path: Path, text: str, settings: Settings) -> Compiled:
    """``list``: the lengths, and one graph per length (the format holds no batch)."""
    lengths = read_list(path, text)
    return Compiled(tuple(lengths), shape_graphs(lengths))


def compile_json(path: Path, text: str, settings: Settings) -> Compiled:
    """``json``: the shapes and, when the file lists them, its graphs (else one a shape)."""
    lengths, graphs = read_json(path, text)
    return Compiled(tuple(lengths), graphs if graphs is not None else shape_graphs(lengths))


def read_list(path: Path, text: str) -> list[Given]:
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


def read_json(path: Path, text: str) -> tuple[list[Given], tuple[Graph, ...] | None]:
    """``json``: exactly ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}, "graphs": {...}}``.

    At most MAX_BUCKET_NAMES named lists holding at most MAX_BUCKETS entries in all: each
    is read in full, so their number and size, like every other count in a
    configuration, are bounded.
    """
    src = str(path)
    top = load_json_object(text, src)
    for key in top:
        if key not in ("comment", "shapes", "batch_sizes", "buckets", "graphs"):
            raise InputError(src, key_line(text, key), key, "unknown key (expected shapes, batch_sizes, buckets, "
                             "graphs, comment)")
    if not isinstance(top.get("comment", ""), str):
        raise InputError(src, key_line(text, "comment"), "comment", f"expected a string, got {shown(top['comment'])}")
    buckets = top.get("buckets", {})
    names = list(buckets) if isinstance(buckets, dict) and len(buckets) <= MAX_BUCKET_NAMES else []
    index = JsonLineIndex(text, ("shapes", "batch_sizes", "buckets", "graphs", *GRAPH_KINDS, *names))
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
    return shapes, (json_graphs(index, src, top["graphs"], {g.value for g in shapes}) if "graphs" in top else None)


def json_graphs(index: JsonLineIndex, src: str, obj, shapes: set[int]) -> tuple[Graph, ...]:
    """``graphs``: ``{"prompt": [[batch, shape], ...], "decode": [[batch, context], ...]}``, each pair positive
    integers, every prompt shape among ``shapes`` and every shape with a prompt graph."""
    line = index.key_line("graphs")
    if not isinstance(obj, dict) or not set(obj) <= set(GRAPH_KINDS) or "prompt" not in obj:
        raise InputError(src, line, "graphs", f"expected {{\"prompt\": [[batch, shape], ...], \"decode\": "
                         f"[[batch, context], ...]}}, got {shown(obj)}")
    out = []
    for kind in GRAPH_KINDS:
        pairs = obj.get(kind, [])
        if not isinstance(pairs, list) or len(pairs) > MAX_BUCKETS:
            raise InputError(src, index.key_line(kind), f"graphs.{kind}", f"expected a list of at most "
                             f"{MAX_BUCKETS} [batch, length] pairs, got {shown(pairs)}")
        for i, (pair, at) in enumerate(zip(pairs, index.element_lines(kind, len(pairs)), strict=True)):
            fld = f"graphs.{kind}[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise InputError(src, at, fld, f"expected [batch, length], got {shown(pair)}")
            out.append(Graph(kind, (check_range(pair[0], src, at, fld), check_range(pair[1], src, at, fld))))
    prompt = {g.dims[1] for g in out if g.kind == "prompt"}
    if prompt != shapes:
        odd = sorted(prompt ^ shapes)[0]
        raise InputError(src, line, "graphs.prompt", f"shape {odd} is in {'graphs' if odd in prompt else 'shapes'} "
                         "but not in the other: the prompt graphs' shapes must be the shapes")
    return graph_set(out)


def planned_list(spec: ExportSpec) -> tuple[Graph, ...]:
    """A list holds shapes only: its graphs are the shapes."""
    return graph_set(Graph("shape", (s,)) for s in spec.shapes)


def planned_json(spec: ExportSpec) -> tuple[Graph, ...]:
    """The plans' graphs: prompt (batch, shape) and, with requests, decode (batch, context bucket)."""
    out = []
    for u in spec.uses:
        for n, context in u.runs():
            out.append(Graph("prompt", (n, u.shape)))
            if context is not None:
                out.append(Graph("decode", (n, context_bucket(context, spec))))
    return graph_set(out)


def write_list(spec: ExportSpec) -> str:
    """``list``: a comment, then one shape a line."""
    head = ("# shapeplan export: compiled sequence lengths, one a line (the batch is not in this format; the "
            f"plans run {count_text(planned_json(spec), spec.compile_ms)})\n")
    return head + "".join(f"{s}\n" for s in spec.shapes)


def write_json(spec: ExportSpec) -> str:
    """``json``: shapes, the batch sizes used, the context buckets when requests were given, and the graphs."""
    buckets = {"context": contexts(spec)} if spec.has_contexts else {}
    graphs = planned_json(spec)
    note = f" ({FREE_BATCH_NOTE})" if spec.compile_ms is None else ""
    comment = f"shapeplan export: the plans run {count_text(graphs, spec.compile_ms)}{note}."
    return json_text({"comment": comment, "shapes": list(spec.shapes), "batch_sizes": list(spec.batch_sizes),
                      "buckets": buckets,
                      "graphs": {kind: [list(g.dims) for g in graphs if g.kind == kind] for kind in GRAPH_KINDS}})

