"""An agent of its own: a loop around the openai client, with its tool and its reward in its own code.

    agentrl train --agent examples/agent/calc_agent.py:solve --agent.demos examples/agent/demos.jsonl
"""

import json
import random

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def tasks(seed):
    a, b = random.Random(seed).randint(10, 49), random.Random(seed + 1).randint(10, 49)
    return {"question": f"What is {a} + {b}?", "answer": a + b}


def solve(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(4):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:  # the final answer
            return float((reply.content or "").strip() == str(task["answer"]))
        for call in reply.tool_calls:
            try:
                result = sum(json.loads(call.function.arguments).values()) if call.function.name == "add" else "?"
            except (ValueError, TypeError):
                result = "error: add takes two integers a and b"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return 0.0
