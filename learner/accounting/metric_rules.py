"""Which episode metrics the learner takes from actors: the names its Problem declares, each
of a bounded length, with finite values of a bounded magnitude.

An actor's finished episodes name their own metrics, and every name becomes a TensorBoard tag
and an entry the learner keeps: unchecked, one message could add thousands of tags or a
name of a megabyte, and one value of 1e308 turns the mean return to inf. So the learner
takes only the names a Problem declares (`Problem.episode_metric_names`, plus
`eval_metric_names` from eval episodes) and values within `Problem.metric_bound`.

A Problem that declares nothing (None, a user's Problem written before declarations) keeps
working: besides the built-in names, the first `UNDECLARED_SLOTS` other names that arrive
are taken for the run, and any later new name is refused. `GetRunInfo` lists all of this,
so a client written from the proto learns the rules before it sends.

`check` runs on the server's event loop (or the debug run's one thread): no lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fleetrl.problems.base import Problem
from fleetrl.problems.eval_records import eval_records
from fleetrl.proto.tensors import WireError

BUILT_IN = ("return", "length")  # every episode has them (actor.episode_tracker)
MAX_NAME_BYTES = 128
UNDECLARED_SLOTS = 32


class MetricRules:
    def __init__(self, problem_name: str, episode_names: tuple[str, ...] | None, eval_names: tuple[str, ...] = (),
                 bound: float = 1e9):
        if not bound > 0:
            raise ValueError(f"problem {problem_name}: metric_bound is {bound}; it must be above 0")
        self.problem_name = problem_name
        self.declared = episode_names is not None
        self.episode_names = tuple(dict.fromkeys((*BUILT_IN, *(episode_names or ()))))
        self.eval_names = tuple(n for n in dict.fromkeys(eval_names) if n not in self.episode_names)
        for name in (*self.episode_names, *self.eval_names):
            if not name or len(name.encode()) > MAX_NAME_BYTES:
                raise ValueError(f"problem {problem_name} declares the metric name {name[:40]!r}: names are 1 to "
                                 f"{MAX_NAME_BYTES} bytes")
        self.bound = float(bound)
        self.undeclared_slots = 0 if self.declared else UNDECLARED_SLOTS
        self._train, self._eval = frozenset(self.episode_names), frozenset(self.eval_names)
        self._taken: set[str] = set()  # undeclared names taken, first come

    @classmethod
    def of(cls, problem: Problem, problem_name: str) -> MetricRules:
        return cls(problem_name, problem.episode_metric_names(), eval_records(problem).eval_metric_names(),
                   problem.metric_bound)

    def check(self, env: int, metrics: Mapping[str, float], evaluating: bool) -> None:
        """Raises WireError naming the first metric of an episode of `env` that breaks the rules."""
        where = f"finished_episodes: env {env}"
        for name, value in metrics.items():
            if not self._known(name, evaluating):
                raise WireError(f"{where} reports the metric {_shown(name)}, {self._why_not(name, evaluating)}")
            if not math.isfinite(value) or abs(value) > self.bound:
                raise WireError(f"{where} metric {name!r} is {value!r}: values must be finite and at most "
                                f"{self.bound:g} in magnitude (Problem.metric_bound)")

    def _known(self, name: str, evaluating: bool) -> bool:
        if name in self._train or (evaluating and name in self._eval) or name in self._taken:
            return True
        if self.declared or len(self._taken) >= self.undeclared_slots or not name or len(
                name.encode()) > MAX_NAME_BYTES:
            return False
        self._taken.add(name)
        return True

    def _why_not(self, name: str, evaluating: bool) -> str:
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            return f"a name of {len(name.encode()):,} bytes: names are 1 to {MAX_NAME_BYTES} bytes"
        if name in self._eval:
            return "which only eval episodes report (Problem.eval_metric_names)"
        if not self.declared:
            return (f"a new name after the {self.undeclared_slots} undeclared ones this run took "
                    f"({', '.join(sorted(self._taken))}): declare the names in Problem.episode_metric_names")
        names = self.episode_names + (self.eval_names if evaluating else ())
        return (f"which problem {self.problem_name} does not declare (it declares {', '.join(names)}): add it to "
                "Problem.episode_metric_names" + (" or eval_metric_names" if evaluating else ""))


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name):,} characters)"
