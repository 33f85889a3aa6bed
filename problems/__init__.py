"""Problems tie an environment, an agent, an optimizer and a loss together.

Built-in Problems are named in `registry.BUILTIN`; users pass their own as
`--problem=my_pkg.my_module:MyProblem`.
"""

from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.eval_records import EvalRecords
from fleetrl.problems.registry import load_problem, problem_class, registered_names

__all__ = ["ActionPolicy", "EvalRecords", "Problem", "ProblemConfig", "load_problem", "problem_class",
           "registered_names"]
