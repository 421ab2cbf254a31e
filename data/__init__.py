"""shapeplan's run-time data as a package, so an installed wheel finds it with ``importlib.resources``.

Only ``default/`` (the embedded default scenario) is package data; ``traces/`` and
``workloads/`` stay in the source tree for the tests, examples and benchmark (see
README.md here).  The import name is ``data`` because the design keeps this folder
at the top of the repository; the wheel installs it as a top-level package.
"""
