"""The project's exceptions: one root, user errors apart from infeasible plans.

The CLI turns every ``SimulatorError`` into one sentence on stderr and its ``exit_code`` (2 for
bad input, 3 for a plan that ``--require-fit`` refuses); anything else is a bug and keeps its
traceback.
"""


class SimulatorError(Exception):
    """Root of every error the CLI reports in one sentence: bad input, a request with no answer, an
    output that cannot be written."""

    exit_code = 2


class ConfigError(SimulatorError):
    """A model, cluster, plan or file that is malformed or breaks a rule."""


class InfeasiblePlanError(SimulatorError):
    """A request that is well formed but has no plan that runs (nothing fits, empty space)."""


class ProfileError(ConfigError):
    """A hardware profile that is missing, corrupt or of an incompatible version."""


class RunRecordError(ConfigError):
    """A reference-loop run record that is missing, malformed or from a crashed run."""


class OutputError(SimulatorError):
    """An output path that cannot be written: a folder, a path the OS refuses, a full disk."""


class PlanDoesNotFit(SimulatorError):
    """``--require-fit``: the plan is valid but its memory peak exceeds the GPU's memory."""

    exit_code = 3
