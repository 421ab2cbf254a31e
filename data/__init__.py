"""shapeplan's run-time data: installed as the package ``model._data``, never as a top-level ``data``.

pyproject.toml maps this folder to ``model._data`` (``package-dir``), so a wheel holds it as
``model/_data/`` and ``importlib.resources.files("model._data")`` finds the embedded default scenario
(``model.pipeline.DEFAULT_SCENARIO``) in a wheel and in an editable install alike.  Only ``default/`` and
``profiles/`` are package data; ``traces/`` and ``workloads/`` stay in the source tree for the tests,
examples and benchmark (see README.md here).

This file is needed: setuptools' editable install finds a remapped subpackage only when it is a regular
package (an ``__init__.py``), not a namespace one (pypa/setuptools#4248).  In a source tree run without
installing, ``model._data`` does not exist and ``model.pipeline`` reads this folder beside ``model/``.
"""
