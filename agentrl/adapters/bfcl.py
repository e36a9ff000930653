"""BFCL's multi-turn function-calling suite as an agentrl environment family: ``agentrl/BFCL-v0``.

The Berkeley Function Calling Leaderboard ships its multi-turn categories on PyPI (``bfcl-eval``): 200 entries each
of ``base``, ``miss_func``, ``miss_param`` and ``long_context``, every one a few user turns against stateful Python
APIs (a file system, a trading bot, travel booking, vehicle control, messaging, posting, ticketing, math), with the
ground-truth calls of each turn. What the adapter takes from BFCL, unchanged:

- the data: each entry's user turns, its ``initial_config`` loaded into fresh API instances
  (``_load_scenario``, ``long_context=True`` for that category), every function of its ``involved_classes`` as
  the tools (as BFCL's inference gives them: its ``excluded_function`` field is read by no BFCL code), their
  descriptions and parameters from BFCL's function docs (converted to OpenAI's schema by BFCL's type mapping);
- the protocol of BFCL's multi-turn inference: within a user turn the policy calls functions until it answers
  without a call; that ends the turn and the next user message is the observation; the last answer ends the
  episode (``terminated``). At most ``steps_per_turn`` calling steps per user turn (BFCL's
  ``MAXIMUM_STEP_LIMIT``, 20): past it BFCL force-quits the entry, here the episode is ``truncated`` with reward 0.
  In ``miss_func`` the held-out functions arrive at their turn with BFCL's own message ("I have updated some more
  functions you can choose from. What about now?"), their docs in the observation;
- the verdict: BFCL's ``multi_turn_checker`` replays the policy's executed calls turn by turn against fresh
  instances beside the ground truth and compares the instances' state and the calls' results. The reward is
  1.0 when it says valid, else 0.0; ``env.verdict`` keeps its answer (``error_type``, ``error_message``).

The held-out split: ``split="eval"`` plays every fifth scenario (entry N when N % 5 == 3, 40 of 200), the same
scenarios in every category, since entry N of each is one scenario; ``split="train"`` (the default) the other 160
(`entry_split`, and docs/evaluation.md, "Splits that mean unseen").

What differs, and why: a malformed call (bad JSON, an unknown function, an argument name the function lacks or a
required one missing) is an error observation within the same user turn, counted in ``info["malformed_calls"]``
(BFCL ends the turn on a response it cannot decode). Argument values are not checked against the docs' types: they
go to the API as written, as BFCL passes them (its own ground truth passes ``ticket_id='ticket_001'`` where the doc
says integer), and a call that raises inside an API class answers BFCL's own ``Error during execution: ...``.
agentrl's chat layout renders every observation in the tool role, so a later user message comes as
``User: ...``. A reply without a call is an answer, not a malformed call (``answers_in_text``).

``bfcl-eval`` declares heavy dependencies (openai, anthropic, vllm extras, faiss, sentence-transformers and a
``numpy==1.26.4`` pin) that its multi-turn part never imports: the API classes need only ``mpmath``, the checker
nothing. Install it without them::

    pip install 'agentrl[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23

``expert_action`` writes each turn's ground-truth calls (one action, in order) and then a reply that ends the
turn; the noise-free expert scores 1.0 on BFCL's checker for the base category (``tests/adapters/test_bfcl.py``).

>>> env = BFCLEnv(category="base", subset=[0])
>>> obs, info = env.reset(seed=0)
>>> info["task_id"], len(env.tool_schemas())
('multi_turn_base_0', 32)
>>> while True:
...     obs, reward, terminated, truncated, info = env.step(env.expert_action())
...     if terminated or truncated:
...         break
>>> reward, terminated, env.verdict
(1.0, True, {'valid': True})
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium
from pydantic import BaseModel, ConfigDict, Field, create_model

from agentrl.core import AgentEnv, Tool

INSTALL_HINT = ("BFCL needs bfcl-eval without its heavy dependencies: pip install 'agentrl[bfcl]' && "
                "pip install --no-deps bfcl-eval==2026.3.23")
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
STEP_LIMIT = 20  # BFCL's MAXIMUM_STEP_LIMIT (constants/default_prompts.py): calling steps allowed in one user turn
BACKEND = "bfcl_eval.eval_checker.multi_turn_eval"
# BFCL's own wording of its multi-turn protocol (default_prompts.py, the "classic" style's multiturn_behavior)
SYSTEM_PROMPT = ("You are an expert in composing functions. You are given a question and a set of possible functions. "
                 "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
                 "If none of the functions can be used, point it out. If the given question lacks the parameters "
                 "required by the function, also point it out.\n\nAt each turn, you should try your best to complete "
                 "the tasks requested by the user within the current turn. Continue to output functions to call until "
                 "you have fulfilled the user's request to the best of your ability. Once you have no more functions "
                 "to call, the system will consider the current turn complete and proceed to the next turn or task.")


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e


def _data_file(*parts: str) -> Any:
    from importlib.resources import files

    try:
        return files("bfcl_eval").joinpath("data", *parts)
    except ModuleNotFoundError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e


def _read_lines(*parts: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _data_file(*parts).read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# BFCL's data, read once per process


@dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn entry: its prompt record (``id``, ``question``, ``initial_config``, ...) and the
    ground-truth calls of each user turn, as BFCL writes them (``"cd(folder='document')"``)."""

    record: dict[str, Any]
    ground_truth: list[list[str]]

    @property
    def id(self) -> str:
        return self.record["id"]


@functools.cache
def load_category(category: str) -> tuple[Entry, ...]:
    """Every entry of ``BFCL_v4_multi_turn_<category>.json`` with its possible answer, in the file's order."""
    if category not in CATEGORIES:
        raise ValueError(f"BFCL: unknown category {category!r}; the multi-turn categories: {', '.join(CATEGORIES)}")
    name = f"BFCL_v4_multi_turn_{category}.json"
    answers = {row["id"]: row["ground_truth"] for row in _read_lines("possible_answer", name)}
    entries = []
    for record in _read_lines(name):
        truth = answers.get(record["id"])
        if truth is None or len(truth) != len(record["question"]):
            raise ValueError(f"BFCL: {name}: entry {record['id']} has no ground truth of {len(record['question'])} "
                             "turns in possible_answer/")
        entries.append(Entry(record, truth))
    return tuple(entries)


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one API class (``data/multi_turn_func_doc/``)."""
    mapping = _import("bfcl_eval.constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_read_lines("multi_turn_func_doc", mapping[class_name]))


def _openai_properties(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type` (model_handler/utils.py, which imports tree-sitter), for the types its
    multi-turn docs use: float is marked as such, unknown types are strings, nested items and properties too."""
    out = {}
    for key, value in properties.items():
        value = dict(value)
        kind = value.get("type", "string")
        if kind == "float":
            value["format"] = "float"
            value["description"] = value.get("description", "") + " This is a float type value."
        value["type"] = mapping.get(kind, "string")
        if "properties" in value:
            value["properties"] = _openai_properties(value["properties"], mapping)
        elif isinstance(value.get("items"), dict):
            value["items"] = _openai_properties({"_": value["items"]}, mapping)["_"]
        out[key] = value
    return out


class _Call(BaseModel):
    """The arguments of one BFCL function; calling it runs the function on the env's live API instance."""

    model_config = ConfigDict(extra="forbid")
    function: ClassVar[str] = ""

    def __call__(self, env: BFCLEnv) -> str:
        return env._execute(self.function, self.model_dump(exclude_unset=True))  # only what the policy gave


@dataclass(frozen=True)
class _BFCLTool(Tool):
    doc: dict[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:  # BFCL's description and parameters, not a rendering of the pydantic model
        return {"type": "function", "function": self.doc}


@functools.cache
def _tool(class_name: str, function: str) -> _BFCLTool:
    """The tool for one function doc (built once per process: pydantic models take milliseconds each)."""
    doc = next(d for d in function_docs(class_name) if d["name"] == function)
    mapping = _import("bfcl_eval.constants.type_mappings").GORILLA_TO_OPENAPI
    params = doc.get("parameters", {})
    props = params.get("properties", {})
    required = set(params.get("required", []))
    fields = {k: (Any, ... if k in required else Field(None)) for k in props}  # names checked, values not
    model = create_model(f"{function}_args", __base__=_Call, **fields)
    model.function = function
    schema = {"name": function, "description": doc.get("description", ""),
              "parameters": {"type": "object", "properties": _openai_properties(props, mapping),
                             "required": [k for k in params.get("required", []) if k in props]}}
    return _BFCLTool(function, schema["description"], model, model.__call__, takes_env=True, doc=schema)


def _literal(value: Any) -> str:
    """A JSON value as Python source that BFCL's checker can `eval` (JSON's NaN and Infinity included)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _ground_truth_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"BFCL ground truth {text!r} is not a plain function call")
    return (node.func.id, [ast.literal_eval(a) for a in node.args],
            {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None})


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# The held-out split. Entry N of every category is one scenario (miss_func, miss_param and long_context rewrite
# base's entry N), so the split goes by N, the same in every category: training on base's train split never shows a
# scenario that miss_param's eval split holds out. Every fifth entry, not a hash of the id: the files run in blocks of
# 50 by their main API (file system, vehicle, trading, travel), so every fifth holds out exactly 10 of each block and
# 40 of 200, where a hash leaves the share per API to chance; and anyone can say by hand which split an entry is in.
# Residue 3: the first three entries (the docs' and tests' examples) and the entries the committed benchmarks train
# on (bfcl_tiny.py, bfcl_smollm2.py) all stay in train.
HELD_OUT_EVERY, HELD_OUT_AT = 5, 3
SPLITS = ("train", "eval")


def entry_number(entry_id: str) -> int:
    """N of ``multi_turn_<category>_N``: the scenario, shared by the four categories."""
    m = re.fullmatch(r"multi_turn_[a-z_]+?_(\d+)", entry_id)
    if m is None:
        raise ValueError(f"BFCL: entry id {entry_id!r} is not multi_turn_<category>_<number>")
    return int(m[1])


def entry_split(entry_id: str) -> str:
    """``eval`` for every fifth scenario (N % 5 == 3), ``train`` for the others.

    >>> [entry_split(f"multi_turn_base_{n}") for n in range(5)]
    ['train', 'train', 'train', 'eval', 'train']
    """
    return "eval" if entry_number(entry_id) % HELD_OUT_EVERY == HELD_OUT_AT else "train"


def _select(entries: Sequence[Entry], split: str, subset: int | str | Sequence[int | str] | None) -> tuple[Entry, ...]:
    """The split's entries, then `subset` of them: an int n, the split's first n; START-STOP, the split's entries at
    positions START..STOP-1 of the category; a list, entries named by position or id, each of which must be in the
    split (an entry of the other split is refused, not dropped: the caller meant it)."""
    if split not in SPLITS:
        raise ValueError(f"BFCL: split must be 'train' or 'eval', got {split!r}")
    pool = tuple(e for e in entries if entry_split(e.id) == split)
    rule = f"entry N is held out (split='eval') when N % {HELD_OUT_EVERY} == {HELD_OUT_AT}"
    if subset is None:
        return pool
    if isinstance(subset, bool):
        raise ValueError(f"BFCL: subset must be a count, a START-STOP range or a list, got {subset!r}")
    if isinstance(subset, int):
        if not 1 <= subset <= len(pool):
            raise ValueError(f"BFCL: subset={subset} must be between 1 and the {split} split's {len(pool)} entries")
        return pool[:subset]
    if isinstance(subset, str):
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", subset)
        if m is None:
            subset = [subset]
        else:
            start, stop = int(m[1]), int(m[2])
            if not 0 <= start < stop <= len(entries):
                raise ValueError(f"BFCL: subset {subset!r} must be START-STOP with 0 <= START < STOP <= "
                                 f"{len(entries)} (STOP excluded, as in range())")
            chosen = tuple(e for e in entries[start:stop] if entry_split(e.id) == split)
            if not chosen:
                raise ValueError(f"BFCL: subset {subset!r} holds no entry of the {split} split ({rule})")
            return chosen
    by_id = {e.id: e for e in entries}
    picked = []
    for item in subset:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < len(entries):
            entry = entries[item]
        elif isinstance(item, str) and item in by_id:
            entry = by_id[item]
        else:
            raise ValueError(f"BFCL: subset item {item!r} is neither an index below {len(entries)} nor an entry id "
                             f"of the category (e.g. {entries[0].id})")
        if entry_split(entry.id) != split:
            raise ValueError(f"BFCL: subset item {item!r} ({entry.id}) is in the {entry_split(entry.id)} split, not "
                             f"{split!r} ({rule}); name entries of one split, or pass split={entry_split(entry.id)!r}")
        picked.append(entry)
    if not picked:
        raise ValueError("BFCL: subset is empty")
    return tuple(picked)


# --------------------------------------------------------------------------------------------
# The environment


class BFCLEnv(AgentEnv):
    """BFCL multi-turn entries, one per episode (see the module docstring).

    `category`: base, miss_func, miss_param or long_context. `split`: ``train`` (160 entries of 200) or ``eval`` (the
    40 held out: every fifth scenario, `entry_split`). `subset`: which entries of the split (None: all; an int n: the
    split's first n; ``"START-STOP"``: the split's entries in that range of the category, STOP excluded; a list of
    indices or ids, all in the split). An episode's seed picks entry ``seed % len(entries)``, so seeds 0..n-1 visit
    a subset once each. `steps_per_turn`: BFCL's step limit within
    one user turn. `max_turns`: the policy turns of an episode (default: every user turn's full step limit).
    `functions`: ``all`` (BFCL's: every function of the entry's classes) or ``path``, only the functions its
    solution uses (the entry's ``path`` and ground truth): not BFCL's benchmark but a prompt of a few functions
    instead of 20-40 (9,000-21,000 characters of schema), for a policy with a short context.
    """

    system_prompt = SYSTEM_PROMPT
    answers_in_text: ClassVar[bool] = True  # a reply without a call ends the user turn; it is not a malformed call

    def __init__(self, category: str = "base", subset: int | str | Sequence[int | str] | None = None,
                 steps_per_turn: int = STEP_LIMIT, max_turns: int | None = None, functions: str = "all",
                 split: str = "train"):
        super().__init__(max_turns=max_turns)
        if functions not in ("all", "path"):
            raise ValueError(f"BFCL: functions must be 'all' (BFCL's) or 'path' (those the solution uses), got "
                             f"{functions!r}")
        self.functions = functions
        category = category.removeprefix("multi_turn_")
        if steps_per_turn < 1:
            raise ValueError(f"BFCL: steps_per_turn must be >= 1, got {steps_per_turn}")
        self.category, self.steps_per_turn, self.budget = category, steps_per_turn, max_turns
        self.split = split
        self.entries = _select(load_category(category), split, subset)
        _import(f"{BACKEND}.multi_turn_checker")  # without bfcl-eval, say so here rather than at the first verdict
        self.entry: Entry | None = None
        self.instances: dict[str, Any] = {}
        self.verdict: dict[str, Any] | None = None
        self._methods: dict[str, Any] = {}
        self._prompt_tools: list[str] = []
        self._tools = {}
        self._user_turn = 0
        self._steps: list[list[list[str]]] = []  # per user turn, per calling step, the calls that ran (BFCL's text)
        self._running: list[str] | None = None  # the calls of the step being run
        self._forced_out = False
        self.entry = self.entries[0]
        self._load(self.entry)  # the tools are known before the first reset (check_env, show-prompt ask)

    def task_ids(self, limit: int | None = None) -> list[str]:
        """The ids of the entries this env plays (its split, its subset), in order; the first `limit`."""
        return [e.id for e in self.entries[:limit]]

    # -- the entry's APIs and tools ------------------------------------------------------------

    def _load(self, entry: Entry) -> None:
        record = entry.record
        long_context = "long_context" in entry.id or "composite" in entry.id  # as BFCL decides it
        self.instances, self._methods = {}, {}
        backend = _import("bfcl_eval.constants.executable_backend_config")
        for class_name in record["involved_classes"]:
            module = _import(backend.CLASS_FILE_PATH_MAPPING[class_name])
            instance = getattr(module, class_name)()
            if class_name not in backend.STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(record["initial_config"].get(class_name, {})),
                                        long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):  # a later class's method of the same name wins, as in BFCL
                    self._methods[name] = method
        held_out = {f for fs in record.get("missed_function", {}).values() for f in fs}
        used = ({p.rpartition(".")[2] for p in record.get("path", [])}
                | {_ground_truth_call(c)[0] for turn in entry.ground_truth for c in turn})
        self._tools = {}
        for class_name in record["involved_classes"]:
            for doc in function_docs(class_name):
                if doc["name"] not in held_out and (self.functions == "all" or doc["name"] in used):
                    self._tools[doc["name"]] = _tool(class_name, doc["name"])
        self._prompt_tools = list(self._tools)
        self._doc_class = {d["name"]: c for c in record["involved_classes"] for d in function_docs(c)}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the prompt shows: the entry's functions at reset (miss_func's later ones arrive in an
        observation, as BFCL's prompting mode gives them)."""
        return [self._tools[n].schema for n in self._prompt_tools]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        record = self.entry.record if self.entry is not None else None
        self._tools = {}
        if record is not None:
            given = set(self._prompt_tools) | {f for k, fs in record.get("missed_function", {}).items()
                                               if int(k) <= self._user_turn for f in fs}
            self._tools = {n: _tool(self._doc_class[n], n) for n in self._doc_class if n in given}

    # -- the gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = seed % len(self.entries) if seed is not None else int(self.np_random.integers(len(self.entries)))
        self.entry = self.entries[index]
        self._load(self.entry)
        turns = len(self.entry.ground_truth)
        self.max_turns = self.budget if self.budget is not None else turns * (self.steps_per_turn + 1)
        self._user_turn, self._steps, self._forced_out, self.verdict = 0, [[]], False, None
        return self._user_message(0), {"task_id": self.entry.id, "user_turns": turns}

    def _user_message(self, turn: int) -> str:
        assert self.entry is not None
        missed = self.entry.record.get("missed_function", {}).get(str(turn))
        if missed:  # BFCL's miss_func turn: the held-out functions arrive, with its own message
            for name in missed:
                self._tools[name] = _tool(self._doc_class[name], name)
            docs = json.dumps([self._tools[n].schema["function"] for n in missed])
            prompts = _import("bfcl_eval.constants.default_prompts")
            return f"{docs}\n{prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}"
        return "\n".join(str(m.get("content", "")) for m in self.entry.record["question"][turn])

    def _run_tools(self, action: str) -> tuple[str, int]:
        if not isinstance(action, str):
            return super()._run_tools(action)  # raises: the rollout's bug
        if not self.tool_format.parse(action, self.tool_schemas()):  # an answer: the user turn ends
            self._user_turn += 1
            if self._user_turn >= len(self.entry.ground_truth):
                self.finish()
                return "(the conversation is over)", 0
            self._steps.append([])
            return "User: " + self._user_message(self._user_turn), 0
        self._running = []
        try:
            observation, bad = super()._run_tools(action)
        finally:
            if self._running:
                self._steps[self._user_turn].append(self._running)
            self._running = None
        if len(self._steps[self._user_turn]) > self.steps_per_turn and not self._finished:
            # BFCL counts a step after running it and force-quits past the limit (so the limit's own steps
            # may still end with an answer), failing the entry: the budget is spent, so truncated
            self._forced_out = True
            self.max_turns = self._turn
            observation += (f"\n(forced to quit: {len(self._steps[self._user_turn])} steps in one user turn, "
                            f"more than {self.steps_per_turn})")
        return observation, bad

    def _execute(self, function: str, arguments: dict[str, Any]) -> str:
        """Run one validated call on the live instance, as BFCL's `execute_multi_turn_func_call` does: a
        method that raises answers ``Error during execution: ...``; a dict result is JSON, anything else str."""
        method = self._methods.get(function)
        text = f"{function}({', '.join(f'{k}={_literal(v)}' for k, v in arguments.items())})"
        if self._running is not None:
            self._running.append(text)
        if method is None:  # a documented function the instances lack: BFCL's eval would raise NameError
            return f"Error during execution: name '{function}' is not defined"
        try:
            result = method(**arguments)
        except Exception as e:  # the API class's own refusal (or bug), shown to the policy as BFCL shows it
            return f"Error during execution: {e}"
        if isinstance(result, str):
            return result
        if isinstance(result, dict):
            try:
                return json.dumps(result)
            except (TypeError, ValueError):
                return str(result)
        return str(result)

    def verify(self) -> float:
        """BFCL's `multi_turn_checker` on the calls that ran; 0.0 for an entry forced out past its step limit."""
        assert self.entry is not None
        if self._forced_out:
            self.verdict = {"valid": False, "error_type": "multi_turn:force_terminated",
                            "error_message": f"more than {self.steps_per_turn} steps in user turn {self._user_turn}"}
            return 0.0
        turns = len(self.entry.ground_truth)
        decoded = [list(s) for s in self._steps] + [[] for _ in range(turns - len(self._steps))]
        # the checker keeps its instances in its module's globals under names built from model_name: a name of
        # our own per call gives fresh instances (a replayed entry would otherwise reuse the last one's state)
        token = uuid.uuid4().hex
        try:
            checker = _import(f"{BACKEND}.multi_turn_checker").multi_turn_checker
            result = checker(decoded[:turns], self.entry.ground_truth, copy.deepcopy(self.entry.record),
                             self.category, f"agentrl_{token}")
        finally:
            space = vars(_import(f"{BACKEND}.multi_turn_utils"))
            for name in [k for k in space if token in k]:
                space.pop(name, None)
        self.verdict = {k: v for k, v in result.items() if k in ("valid", "error_type", "error_message")}
        return 1.0 if result.get("valid") else 0.0

    # -- the expert -------------------------------------------------------------------------------

    def _expert_calls(self, truth: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        calls = []
        for text in truth:
            name, args, kwargs = _ground_truth_call(text)
            if args:  # BFCL writes some calls positionally ("sort('final_report.pdf')"): name them
                names = list(inspect.signature(self._methods[name]).parameters)
                kwargs = {**dict(zip(names, args)), **kwargs}
            calls.append((name, kwargs))
        return calls

    def expert_action(self, noise: float = 0.0) -> str:
        """The user turn's ground-truth calls in one action, then a reply that ends the turn. With probability
        `noise / 5` a garbled call; with probability `noise / 3` one of the turn's calls left out."""
        assert self.entry is not None
        rng = self.np_random
        truth = self.entry.ground_truth[min(self._user_turn, len(self.entry.ground_truth) - 1)]
        if truth and not self._steps[self._user_turn]:
            if noise > 0 and rng.random() < noise / 5:
                return '<tool_call>{"name": "' + truth[0].split("(")[0] + '", "arguments": {'
            calls = self._expert_calls(truth)
            if noise > 0 and len(calls) > 1 and rng.random() < noise / 3:
                calls.pop(int(rng.integers(len(calls))))
            return "".join(_call(name, kwargs) for name, kwargs in calls)
        return "Done." if truth else "I cannot do that with the functions and information I have."


gymnasium.register(id="agentrl/BFCL-v0", entry_point="agentrl.adapters.bfcl:BFCLEnv", kwargs={"category": "base"},
                   disable_env_checker=True, order_enforce=False)
