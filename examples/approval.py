"""An approval flow: a run waits (``dampen``) until someone decides, then resumes with the decision.

    python examples/approval.py [--database-url URL]

``ExpenseApproval`` submits an expense, then dampens: the branch stops and the run
is ``dampened``, holding no worker, thread or lock, for as long as the decision
takes. An approver, here a function standing in for a web request, finds the run
by id and calls ``run.resume(input={...})``. The decision becomes the input of
``RecordDecision``, the step after the dampen, and a ``divert`` on its output
routes to ``PayExpense`` or ``NotifySubmitter``.

The resume input replaces the output of the step before the dampen. So
``SubmitExpense`` keeps the expense in the run's ``Context``, where the steps after
the dampen read it. The example also shows that a run can be resumed only once.
A second ``resume`` finds no dampened branch and raises ``RunStateError``.

Runs in this process (``ductwork.testing.drain``) on a fresh SQLite file unless
``--database-url`` names another database (one the example can have to itself).
Exits 0 when both runs dampened, then completed on the branch their decision
chose, and the second resume was refused. Otherwise it exits 1 and says what went
wrong.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import ductwork
from ductwork import Pipeline, Step
from ductwork.db import migrate
from ductwork.errors import RunStateError
from ductwork.testing import drain


class SubmitExpense(Step):
    def __init__(self, expense):
        self.expense = expense

    def execute(self):
        # Steps after the dampen get the approver's input, not this output: keep the
        # expense in the run's Context. overwrite=True because a re-run stores the same value.
        self.context.set("expense", self.expense, overwrite=True)
        return f"expense {self.expense['id']} awaiting approval"


class RecordDecision(Step):
    def __init__(self, decision):
        self.decision = decision

    def execute(self):
        self.context.set("decided_by", self.decision["by"], overwrite=True)
        return self.decision["decision"]  # "approved" or "rejected": the divert key


class PayExpense(Step):
    def __init__(self, decision):
        pass

    def execute(self):
        expense = self.context.get("expense")
        return (f"paid {expense['amount']:.2f} to {expense['submitter']} "
                f"(approved by {self.context.get('decided_by')}, payout key …{self.idempotency_key[-8:]})")


class NotifySubmitter(Step):
    def __init__(self, decision):
        self.decision = decision

    def execute(self):
        expense = self.context.get("expense")
        return f"told {expense['submitter']}: {self.decision} by {self.context.get('decided_by')}"


class ExpenseApproval(Pipeline):
    @classmethod
    def define(cls, pipeline):
        (pipeline.start(SubmitExpense)
                 .dampen(before=RecordDecision)
                 .divert(to={"approved": PayExpense, "otherwise": NotifySubmitter}))


def approve(app: ductwork.App, run_id: str, decision: str, by: str) -> None:
    """What an approver's web request does: find the run and resume it with the decision."""
    app.run(run_id).resume(input={"decision": decision, "by": by})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a database the example may use alone (default: a fresh SQLite file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ductwork-approval-") as workdir:
        return demonstrate(args.database_url or f"sqlite:///{Path(workdir) / 'ductwork.sqlite3'}")


def demonstrate(url: str) -> int:
    app = ductwork.connect(url)
    migrate.upgrade(app.engine)
    problems = []
    expenses = [{"id": "E-1", "submitter": "ann", "amount": 120.0},
                {"id": "E-2", "submitter": "bob", "amount": 5000.0}]
    runs = [ExpenseApproval.trigger(expense) for expense in expenses]
    drain(app)
    for run in runs:
        print(f"run …{run.id[-8:]} ({run.steps()[0].input[0]['id']}): {run.refresh().status}, "
              f"waiting after {run.steps()[-1].output!r}")
        if run.status != "dampened":
            problems.append(f"run {run.id} is {run.status}, not dampened")

    print("\napprover: E-1 approved by dana, E-2 rejected by dana")
    approve(app, runs[0].id, "approved", by="dana")
    approve(app, runs[1].id, "rejected", by="dana")
    drain(app)

    expected = {runs[0].id: "PayExpense", runs[1].id: "NotifySubmitter"}
    for run in runs:
        last = run.steps()[-1]
        print(f"run …{run.id[-8:]}: {run.refresh().status}, {last.node.split('#')[0]}: {last.output}")
        if run.status != "completed" or not last.node.startswith(expected[run.id] + "#"):
            problems.append(f"run {run.id} is {run.status} at {last.node}, expected {expected[run.id]}")

    try:
        approve(app, runs[0].id, "rejected", by="eve")
        problems.append("a second resume of a completed run was accepted")
    except RunStateError as error:
        print(f"\nsecond resume refused: {error}")
    app.dispose()

    if problems:
        print("\nFAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("\nok: both runs waited for a decision and took the branch it chose")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
