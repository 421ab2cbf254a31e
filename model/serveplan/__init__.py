"""Serving mode's graph planner: the prompt and decode graphs a stack should compile for a trace, judged by the replay.

``demands`` records what a replay's steps asked for, ``cover`` is the MIP that opens at
most N graphs and assigns every recorded demand to the graph the stack's lookup would
pick, ``plan`` alternates replay and MIP until the graph set is stable, ``configs``
writes the set in the stacks' formats.
"""
