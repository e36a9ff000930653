"""Agents the gateway tests drive: each a plain function of the kind a user writes around an OpenAI client."""

from __future__ import annotations

import json
import time

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def tasks(seed):
    return {"question": f"What is {seed % 7 + 10} + {seed % 5 + 20}?", "answer": seed % 7 + 10 + seed % 5 + 20}


def _loop(client, task, messages, calls=4):
    for _ in range(calls):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return float((reply.content or "").strip() == str(task["answer"]))
        for call in reply.tool_calls:
            try:
                result = sum(json.loads(call.function.arguments).values())
            except (ValueError, TypeError, AttributeError):
                result = "error: add takes two integers a and b"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return 0.0


def solve(task, client):
    """Appends only: each call's history is the last call's plus the reply and the tool results."""
    return _loop(client, task, [{"role": "user", "content": task["question"]}])


async def solve_async(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    reply = (await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)).choices[0].message
    return float((reply.content or "").strip() == str(task["answer"])) if not reply.tool_calls else 0.5


def solve_rewriting(task, client):
    """Rewrites its history before every call after the first: the task and a one-line summary of the last reply
    (a compacting agent), so that every call after the first opens a segment."""
    messages = [{"role": "user", "content": task["question"]}]
    for k in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=12).choices[0].message
        said = (reply.content or "")[-10:]
        messages = [{"role": "system", "content": f"Summary {k}: {said}"},
                    {"role": "user", "content": task["question"]}]
    return 1.0 if task["answer"] % 2 else 0.0


def solve_raising(task, client):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    raise RuntimeError("the agent's own bug")


def solve_none(task, client):
    _loop(client, task, [{"role": "user", "content": task["question"]}], calls=1)
    return None


def verify(task, messages):
    return float(messages[-1]["role"] == "assistant")


def solve_silent(task, client):
    """Calls once, then hangs in its own code (a stuck tool) past the session timeout."""
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    time.sleep(3.0)
    return 1.0


def solve_by_url(task, base_url, api_key, model):
    """Builds its own client, as a framework does from a base URL, a key and a model name."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return solve(task, client) if model else 0.0


def solve_parity(task, client):
    """One call; the reward is the parity of the reply's length (varies with the sample: GRPO groups carry signal)."""
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    return float(len(reply.choices[0].message.content or "") % 2)
