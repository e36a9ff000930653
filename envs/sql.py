"""agentrl/SQL-v0: a seeded SQLite database, a question, a query tool, and a submit tool.

>>> env = SQLEnv()
>>> obs, info = env.reset(seed=1)
>>> _ = env.step(env.expert_action())            # look at the data with the gold query
>>> env.step(env.expert_action())[1]             # submit it
1.0

The reward compares the rows of the submitted query with the gold query's rows on the same
database (`agentrl.verify.sql`): order matters only when the question asks for an order, and
duplicates count. The query tool shows at most `show_rows` rows, and says how many it left out.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from agentrl.envs.answer import AnswerEnv, call_text
from agentrl.verify.sql import QueryError, SQLTask, SQLVerifier, connect, run_query

FIRST = ["Ada", "Bo", "Cal", "Dot", "Eve", "Fin", "Gus", "Hal", "Ivy", "Jo", "Kai", "Lu"]
DEPTS = ["eng", "ops", "sales"]


class SQLEnv(AnswerEnv):
    """Answer a question about a small company database with one SELECT query."""

    system_prompt = "Answer the question with one SQLite SELECT query. Try queries with `query`, then `submit` one."
    max_turns = 4

    def __init__(self, max_turns: int | None = None, n_rows: int = 8, show_rows: int = 5):
        super().__init__(max_turns=max_turns)
        self.n_rows = n_rows
        self.show_rows = show_rows
        self.verifier = SQLVerifier()

    def query(self, sql: str) -> str:
        """Run a SELECT query on the database and see (some of) its rows."""
        try:
            cols, rows = run_query(self._con, sql, max_rows=1000)
        except QueryError as e:
            return f"error: {str(e)[:120]}"
        shown = "; ".join(", ".join(str(v) for v in r) for r in rows[: self.show_rows])
        more = f" (+{len(rows) - self.show_rows} more rows not shown)" if len(rows) > self.show_rows else ""
        return f"{len(rows)} rows: {shown}{more}"[:300]

    def submit(self, sql: str) -> str:
        """Submit your final query. Ends the episode."""
        return self.submit_answer(sql)

    tools = [query, submit]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        names = list(rng.permutation(FIRST)[: self.n_rows])
        rows = [(i + 1, str(n), DEPTS[int(rng.integers(3))], int(rng.integers(3, 13)) * 10, int(rng.integers(20, 60)))
                for i, n in enumerate(names)]
        values = ", ".join(f"({i}, '{n}', '{d}', {s}, {a})" for i, n, d, s, a in rows)
        schema = ("CREATE TABLE emp(id INTEGER PRIMARY KEY, name TEXT, dept TEXT, salary INTEGER, age INTEGER); "
                  f"INSERT INTO emp VALUES {values};")
        if hasattr(self, "_con"):
            self._con.close()
        self._con = connect(schema)
        for _ in range(100):
            # A filter that keeps every row (or none), or a MAX that the other rows share, makes a
            # degenerate task that a wrong query also solves; the verifier probe found these.
            # Redraw until the filter matters.
            question, gold = self._question(rng, rows)
            _, want = run_query(self._con, gold)
            others = [sorted(map(repr, run_query(self._con, q)[1])) for q in (_without_filter(gold), _negated(gold))
                      if q != gold]
            if want and all(v not in (0, None) for r in want for v in r) and sorted(map(repr, want)) not in others:
                break
        self.task = SQLTask(schema=schema, gold=gold, question=question, task_id=f"sql-{seed}")
        obs = (f"Table emp(id, name, dept, salary, age), {len(rows)} rows; dept is one of eng, ops, sales.\n"
               f"Question: {question}")
        return obs, {"task_id": self.task.task_id}

    @staticmethod
    def _question(rng: Any, rows: list[tuple[Any, ...]]) -> tuple[str, str]:
        kind = int(rng.integers(5))
        dept = DEPTS[int(rng.integers(3))]
        sal = int(rng.integers(4, 12)) * 10
        age = int(rng.integers(25, 50))
        if kind == 0:
            return f"List the names of the people in {dept}.", f"SELECT name FROM emp WHERE dept = '{dept}'"
        if kind == 1:
            return f"How many people earn more than {sal}?", f"SELECT COUNT(*) FROM emp WHERE salary > {sal}"
        if kind == 2:
            return f"What is the highest salary in {dept}?", f"SELECT MAX(salary) FROM emp WHERE dept = '{dept}'"
        if kind == 3:
            return (f"List the names of people older than {age}, youngest first.",
                    f"SELECT name FROM emp WHERE age > {age} ORDER BY age, id")
        return "For each dept, give the dept and its number of people.", "SELECT dept, COUNT(*) FROM emp GROUP BY dept"

    def expert_action(self, noise: float = 0.0) -> str:
        rng = self.np_random
        if noise > 0 and rng.random() < noise / 2:
            return "SELECT name FROM emp" if rng.random() < 0.5 else '<tool_call>{"name": "query"}'
        if self.turn == 0:
            return call_text("query", sql=self.task.gold)
        sql = self.task.gold
        if noise > 0 and rng.random() < noise / 2:
            sql = _negated(sql)  # the condition backwards: surely other rows (the task generator checks)
        return call_text("submit", sql=sql)

    # -- verifier probe hooks ---------------------------------------------------------------

    def probe_reference(self) -> str:
        return self.task.gold

    def probe_attacks(self) -> dict[str, tuple[str, bool]]:
        gold = self.task.gold
        attacks = {
            "every row": ("SELECT * FROM emp", False),
            "no rows": (f"{gold.split(' ORDER BY')[0]} LIMIT 0", False),
            "right columns, no filter": (_without_filter(gold), _without_filter(gold) == gold),
            "correct-looking, wrong content": (_negated(gold), False),
            "two statements": (f"{gold}; DROP TABLE emp", False),
            "writes the database": ("DELETE FROM emp", False),
            "attaches a file": ("ATTACH DATABASE '/tmp/agentrl-probe.db' AS x", False),
            "reference, lower case keywords": (gold.replace("SELECT", "select").replace("FROM", "from"), True),
        }
        for agg in ("COUNT(*)", "MAX(salary)"):
            if agg in gold:  # the number as text: '3' is not 3
                attacks["type: number as text"] = (gold.replace(agg, f"CAST({agg} AS TEXT)"), False)
        return attacks

    def probe_secrets(self) -> list[tuple[str, str]]:
        return [(self.task.gold, "all")]


def _without_filter(gold: str) -> str:
    """The gold query minus its WHERE clause: what a policy that ignores the question submits."""
    cols = gold.split(" FROM ")[0].removeprefix("SELECT").strip()
    return f"SELECT {cols} FROM emp" + (" GROUP BY dept" if "GROUP BY" in gold else "")


def _negated(gold: str) -> str:
    """The gold query with its condition negated (or its count off by one): surely other rows."""
    if " WHERE " in gold:
        head, _, cond = gold.partition(" WHERE ")
        cond, order, rest = cond.partition(" ORDER BY ")
        return f"{head} WHERE NOT ({cond})" + (f" ORDER BY {rest}" if order else "")
    return gold.replace("COUNT(*)", "COUNT(*) + 1")


gymnasium.register(id="agentrl/SQL-v0", entry_point="agentrl.envs.sql:SQLEnv", kwargs={},
                   disable_env_checker=True, order_enforce=False)  # gymnasium.make returns the bare AgentEnv
