"""Entry points: `learner`, `actor` and `local` (everything on one machine).

absl flags live here and nowhere else: each entry point turns its flags into a config
dataclass and passes that down.
"""
