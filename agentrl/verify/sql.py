"""SQL verifier: run the answer and the gold query on the same SQLite database, compare rows.

>>> task = SQLTask(schema="CREATE TABLE t(x INT); INSERT INTO t VALUES (1), (2), (2);",
...                gold="SELECT x FROM t WHERE x > 1")
>>> v = SQLVerifier()
>>> v(task, "SELECT x FROM t WHERE x >= 2").score
1.0
>>> v(task, "SELECT DISTINCT x FROM t WHERE x >= 2").reason
'rows differ: 1 rows, expected 2 (duplicates count)'
>>> v(task, "DROP TABLE t").reason
'query rejected: not authorized (only reading queries are allowed)'

Rows are compared as a multiset by default (order ignored, duplicates counted); ``ordered=None``
means "ordered when the gold query has a top-level ORDER BY". Floats are compared at
`float_digits` significant digits (AVG and SUM/COUNT may differ in the last bit). The answer runs
read-only under an authorizer (no ATTACH, PRAGMA, writes, or extensions), with a step budget and a
row cap, in a fresh in-memory database.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.verify.base import NotVerifiable, Verdict, VerifierError, register_verifier

__all__ = ["QueryError", "SQLTask", "SQLVerifier", "run_query"]

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
            getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


class QueryError(Exception):
    """The policy's query failed (syntax, not authorized, too slow): a score of 0, not a bug."""


@dataclass(frozen=True)
class SQLTask:
    """`schema` is trusted SQL that builds the database; `gold` is the reference query."""

    schema: str
    gold: str
    question: str = ""
    task_id: str = ""
    ordered: bool | None = None
    distinct: bool = False  # True: compare sets of rows (duplicates ignored)
    kind: ClassVar[str] = "sql"

    @property
    def is_ordered(self) -> bool:
        if self.ordered is not None:
            return self.ordered
        # an ORDER BY outside parentheses (not inside a subquery)
        depth, text = 0, []
        for ch in self.gold:
            depth += ch == "("
            depth -= ch == ")"
            text.append(ch if depth == 0 else " ")
        return re.search(r"\border\s+by\b", "".join(text), re.IGNORECASE) is not None


def connect(schema: str) -> sqlite3.Connection:
    """A fresh in-memory database built from `schema` (trusted SQL)."""
    con = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        con.executescript(schema)
    except sqlite3.Error as e:
        raise VerifierError(f"the task's schema SQL failed: {e}") from e
    return con


def run_query(con: sqlite3.Connection, query: str, max_rows: int = 10_000,
              max_steps: int = 5_000_000) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one untrusted read-only query; returns (column names, rows). Raises `QueryError`."""
    def authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY

    steps = [0]

    def progress() -> int:
        steps[0] += 1000
        return int(steps[0] > max_steps)  # non-zero aborts the query

    con.set_authorizer(authorizer)
    con.set_progress_handler(progress, 1000)
    try:
        cur = con.execute(query)
        rows = cur.fetchmany(max_rows + 1)
        cols = [d[0] for d in cur.description or []]
    except sqlite3.OperationalError as e:
        if "interrupted" in str(e):
            raise QueryError(f"query stopped after {max_steps:,} steps (too slow)") from None
        if "not authorized" in str(e):
            raise QueryError("not authorized (only reading queries are allowed)") from None
        raise QueryError(str(e)) from None
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as e:
        if "not authorized" in str(e):
            raise QueryError("not authorized (only reading queries are allowed)") from None
        raise QueryError(f"{type(e).__name__}: {e}") from None
    finally:
        con.set_authorizer(None)
        con.set_progress_handler(None, 0)
    if not cols:
        raise QueryError("the statement returned no result set (is it a SELECT?)")
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows:,} rows")
    return cols, rows


def _norm_value(v: Any, digits: int) -> Any:
    if isinstance(v, float):
        return float(f"{v:.{digits}g}")
    return v


def compare_rows(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]], ordered: bool, distinct: bool,
                 digits: int = 9) -> str | None:
    """None if equal under the options, else why not."""
    g = [tuple(_norm_value(v, digits) for v in r) for r in got]
    w = [tuple(_norm_value(v, digits) for v in r) for r in want]
    if w and g and len(g[0]) != len(w[0]):
        return f"{len(g[0])} columns, expected {len(w[0])}"
    if distinct:
        if set(g) != set(w):
            return f"rows differ: {len(set(g))} distinct rows, expected {len(set(w))}"
        return None
    if ordered:
        if g != w:
            if Counter(g) == Counter(w):
                return "rows differ or are in the wrong order"
            return f"rows differ: {len(g)} rows, expected {len(w)}"
        return None
    if Counter(g) != Counter(w):
        return f"rows differ: {len(g)} rows, expected {len(w)} (duplicates count)"
    return None


@dataclass
class SQLVerifier:
    max_chars: int = 2_000
    float_digits: int = 9
    kind: ClassVar[str] = "sql"

    def __call__(self, task: Any, answer: Any) -> Verdict:
        task = _as_task(task)
        if not isinstance(answer, str) or not answer.strip():
            return Verdict(0.0, "empty query")
        if len(answer) > self.max_chars:
            return Verdict(0.0, f"query longer than {self.max_chars} characters")
        con = connect(task.schema)
        try:
            try:
                _, want = run_query(con, task.gold)
            except QueryError as e:
                raise VerifierError(f"sql verifier, task {task.task_id!r}: the gold query failed: {e}") from e
            try:
                _, got = run_query(con, answer)
            except QueryError as e:
                return Verdict(0.0, f"query rejected: {e}")
        finally:
            con.close()
        why = compare_rows(got, want, task.is_ordered, task.distinct, self.float_digits)
        if why:
            return Verdict(0.0, why, {"rows": len(got)})
        return Verdict(1.0, f"{len(got)} rows match the gold query", {"rows": len(got)})


def _as_task(task: Any) -> SQLTask:
    if isinstance(task, SQLTask):
        return task
    if isinstance(task, dict) and task.get("kind") == "sql":
        try:
            return SQLTask(task["schema"], task["gold"], task.get("question", ""), task.get("task_id", ""),
                           task.get("ordered"), task.get("distinct", False))
        except KeyError as e:
            raise NotVerifiable(f"sql task is missing {e}") from e
    raise NotVerifiable(f"the sql verifier cannot judge a {type(task).__name__}")


register_verifier("sql", SQLVerifier)
