"""Framework overhead per call, with a model that answers instantly in-process.

Run by hand: ``python benchmarks/bench_overhead.py``. Scenarios:

- S1: one turn, str -> str, with a message-window memory;
- S2: 100 users round-robin x 20 turns, each user's memory capped at 20 messages;
- S3: a 3-field pydantic return (no memory);
- S4: one tool round trip (tool request, tool, final answer).

Each contender runs in a process of its own, and their rounds alternate (see
``_interleave``): ``--against REF`` adds another git ref of this project (say the previous
main), ``--peers`` adds magentic, pydantic-ai and langchain-core when installed
(``pip install -e ".[bench]"``). The ratios are this checkout's median over each one's.

    python benchmarks/bench_overhead.py --against origin/main --peers
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

from pydantic import BaseModel

from aiservices import (
    AiMessage,
    MemoryId,
    MessageWindowChatMemory,
    ToolExecutionRequest,
    ai_service,
    tool,
)
from aiservices.models import ChatRequest, ChatResponse


class Person(BaseModel):
    name: str
    age: int
    city: str


PERSON_JSON = '{"name": "Ada", "age": 36, "city": "London"}'


# -- aiservices -----------------------------------------------------------------------


class InstantModel:
    """Answers at once: a fixed text, a JSON value, or a tool request then a text."""

    def __init__(self, text: str) -> None:
        self.response = ChatResponse(AiMessage(text))

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self.response


class ToolThenText:
    def __init__(self) -> None:
        self.call = ChatResponse(
            AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "add", '{"a":2,"b":3}')])
        )
        self.text = ChatResponse(AiMessage("5"))

    def chat(self, request: ChatRequest) -> ChatResponse:
        last = request.messages[-1]
        return self.text if type(last).__name__ == "ToolExecutionResultMessage" else self.call


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


class Extract(Protocol):
    def extract(self, text: str) -> Person: ...


class Calc(Protocol):
    def ask(self, question: str) -> str: ...


def ours() -> dict[str, Callable[[int], Any]]:
    s1 = ai_service(
        Chat,
        model=InstantModel("Hello!"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    s2 = ai_service(
        Chat,
        model=InstantModel("Hello!"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    users = [f"user{i}" for i in range(100)]
    s3 = ai_service(Extract, model=InstantModel(PERSON_JSON))
    s4 = ai_service(Calc, model=ToolThenText(), tools=[add])
    return {
        "S1": lambda i: s1.chat("alice", "Hi there"),
        "S2": lambda i: s2.chat(users[i % 100], "Hi there"),
        "S3": lambda i: s3.extract("Ada, 36, lives in London"),
        "S4": lambda i: s4.ask("What is 2 + 3?"),
    }


# -- peers ----------------------------------------------------------------------------


def magentic_scenarios() -> dict[str, Callable[[int], Any]] | None:
    try:
        from magentic import AssistantMessage, FunctionCall, UserMessage, prompt
        from magentic import Chat as MChat
        from magentic.chat_model.base import ChatModel as MChatModel
    except ImportError:
        return None

    class Instant(MChatModel):
        def __init__(self, answer: Callable[[list[Any], Any], Any]) -> None:
            self.answer = answer

        def complete(
            self,
            messages: Any,
            functions: Any = None,
            output_types: Any = None,
            *,
            stop: Any = None,
        ) -> Any:
            return AssistantMessage(self.answer(list(messages), output_types))

        async def acomplete(
            self,
            messages: Any,
            functions: Any = None,
            output_types: Any = None,
            *,
            stop: Any = None,
        ) -> Any:
            return self.complete(messages, functions, output_types, stop=stop)

    hello = Instant(lambda m, t: "Hello!")

    @prompt("{message}", model=hello)
    def s1(message: str) -> str: ...

    histories: dict[str, Any] = {}

    def s2(i: int) -> Any:
        key = f"user{i % 100}"
        chat = histories.get(key) or MChat(model=hello)
        chat = chat.add_user_message("Hi there").submit()
        histories[key] = MChat(chat.messages[-20:], model=hello)
        return chat.last_message.content

    chat_s1: dict[str, Any] = {"c": MChat(model=hello)}

    def s1_memory(i: int) -> Any:
        chat = chat_s1["c"].add_user_message("Hi there").submit()
        chat_s1["c"] = MChat(chat.messages[-20:], model=hello)
        return chat.last_message.content

    person = Instant(lambda m, t: Person(name="Ada", age=36, city="London"))

    @prompt("Extract: {text}", model=person)
    def s3(text: str) -> Person: ...

    def add_numbers(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def tool_answer(messages: list[Any], types: Any) -> Any:
        if isinstance(messages[-1], UserMessage) and len(messages) == 1:
            return FunctionCall(add_numbers, 2, 3)
        return "5"

    tool_model = Instant(tool_answer)

    def s4(i: int) -> Any:
        chat = MChat(
            [UserMessage("What is 2 + 3?")],
            functions=[add_numbers],
            output_types=[str, FunctionCall],
            model=tool_model,
        ).submit()
        call = chat.last_message.content
        chat = chat.exec_function_call().submit() if isinstance(call, FunctionCall) else chat
        return chat.last_message.content

    del s1
    return {"S1": s1_memory, "S2": s2, "S3": lambda i: s3("Ada, 36, lives in London"), "S4": s4}


def pydantic_ai_scenarios() -> dict[str, Callable[[int], Any]] | None:
    try:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel
    except ImportError:
        return None

    def hello(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("Hello!")])

    agent = Agent(FunctionModel(hello))
    history: dict[str, list[Any]] = {}

    def chat(key: str) -> Any:
        result = agent.run_sync("Hi there", message_history=history.get(key))
        history[key] = result.all_messages()[-20:]
        return result.output

    def person(messages: list[Any], info: AgentInfo) -> ModelResponse:
        tool_name = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(tool_name, PERSON_JSON)])

    extract = Agent(FunctionModel(person), output_type=Person)

    def calc_model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("add_numbers", {"a": 2, "b": 3})])
        return ModelResponse(parts=[TextPart("5")])

    calc = Agent(FunctionModel(calc_model))

    @calc.tool_plain
    def add_numbers(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return {
        "S1": lambda i: chat("alice"),
        "S2": lambda i: chat(f"user{i % 100}"),
        "S3": lambda i: extract.run_sync("Ada, 36, lives in London").output,
        "S4": lambda i: calc.run_sync("What is 2 + 3?").output,
    }


def langchain_scenarios() -> dict[str, Callable[[int], Any]] | None:
    try:
        from langchain_core.chat_history import InMemoryChatMessageHistory
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langchain_core.output_parsers import PydanticOutputParser
        from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
        from langchain_core.runnables.history import RunnableWithMessageHistory
    except ImportError:
        return None

    model = FakeListChatModel(responses=["Hello!"])
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{message}")]
    )
    stores: dict[str, InMemoryChatMessageHistory] = {}

    def history(session_id: str) -> InMemoryChatMessageHistory:
        found = stores.get(session_id)
        if found is None:
            found = stores[session_id] = InMemoryChatMessageHistory()
        if len(found.messages) > 20:
            found.messages = found.messages[-20:]
        return found

    chain = RunnableWithMessageHistory(
        prompt | model, history, input_messages_key="message", history_messages_key="history"
    )
    parser = PydanticOutputParser(pydantic_object=Person)
    extract = (
        ChatPromptTemplate.from_messages([("human", "Extract: {text}")])
        | FakeListChatModel(responses=[PERSON_JSON])
        | parser
    )

    def ask(key: str) -> Any:
        return chain.invoke(
            {"message": "Hi there"}, config={"configurable": {"session_id": key}}
        ).content

    return {
        "S1": lambda i: ask("alice"),
        "S2": lambda i: ask(f"user{i % 100}"),
        "S3": lambda i: extract.invoke({"text": "Ada, 36, lives in London"}),
    }


def scenarios(contender: str) -> dict[str, Callable[[int], Any]] | None:
    """The scenarios of one contender, made in its worker process."""
    return {
        "aiservices": ours,
        "magentic": magentic_scenarios,
        "pydantic-ai": pydantic_ai_scenarios,
        "langchain-core": langchain_scenarios,
    }[contender]()


if __name__ == "__main__":
    from _interleave import main

    main(
        __file__,
        scenarios,
        names=("S1", "S2", "S3", "S4"),
        peers=("magentic", "pydantic-ai", "langchain-core"),
        slow=("pydantic-ai", "langchain-core"),
    )
