"""The project's exceptions: one root, user errors apart from infeasible plans.

The CLI turns every ``SimulatorError`` into one sentence on stderr and exit code 2;
anything else is a bug and keeps its traceback.
"""


class SimulatorError(Exception):
    """Root of every error a user can cause with bad input."""


class ConfigError(SimulatorError):
    """A model, cluster, plan or file that is malformed or breaks a rule."""


class InfeasiblePlanError(SimulatorError):
    """A request that is well formed but has no plan that runs (nothing fits, empty space)."""


class ProfileError(ConfigError):
    """A hardware profile that is missing, corrupt or of an incompatible version."""


class RunRecordError(ConfigError):
    """A reference-loop run record that is missing, malformed or from a crashed run."""
