"""The task of gateway_agents.py (``What is A + B?`` with an ``add`` tool) solved by agent frameworks from PyPI,
each written as its own docs show; only the base URL, the key and the model name point at the gateway.

test_gateway_frameworks.py runs them through `AgentRunner`. The imports sit inside each `solve` so that the
file loads with any of the frameworks missing (`pip install 'agentrl[agents]'` brings them all).
"""

from __future__ import annotations


def tasks(seed):
    return {"question": f"What is {seed % 7 + 10} + {seed % 5 + 20}?", "answer": seed % 7 + 10 + seed % 5 + 20}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def _reward(task, answer) -> float:
    return float(str(answer).strip() == str(task["answer"]))


async def solve_openai_agents(task, base_url, api_key, model):
    """The OpenAI Agents SDK on its chat-completions model (the gateway serves chat completions, not Responses)."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # traces go to OpenAI's servers otherwise
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    agent = Agent(name="adder", instructions="Use the add tool, then answer with the number alone.",
                  tools=[function_tool(add)], model=OpenAIChatCompletionsModel(model=model, openai_client=client))
    result = await Runner.run(agent, task["question"])
    return _reward(task, result.final_output)


def solve_langgraph(task, base_url, api_key, model):
    """LangGraph's tool-calling loop by hand (a model node, `ToolNode`, `tools_condition`) on LangChain's ChatOpenAI."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    tools = [tool(add)]
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key).bind_tools(tools)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    state = graph.compile().invoke({"messages": [("user", task["question"])]})
    return _reward(task, state["messages"][-1].content)


def solve_smolagents(task, base_url, api_key, model):
    """smolagents' ToolCallingAgent on its OpenAI-compatible model; it answers through its `final_answer` tool."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key=api_key)
    agent = ToolCallingAgent(tools=[tool(add)], model=llm, max_steps=4)
    return _reward(task, agent.run(task["question"]))
