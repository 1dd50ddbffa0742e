"""MCP servers as toolsets: real servers in separate processes, over stdio and HTTP, called
from sync and async methods, failing and crashing."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from _servers import serving

from aiservices import AiMessage, InterfaceError, ToolExecutionRequest, ai_service
from aiservices.mcp import McpToolset
from aiservices.testing import ScriptedChatModel

SERVER = Path(__file__).parent / "mcp_servers" / "weather.py"


class Bot(Protocol):
    def ask(self, text: str) -> str: ...


class AsyncBot(Protocol):
    async def ask(self, text: str) -> str: ...


def _calls(*calls: tuple[str, str]) -> AiMessage:
    return AiMessage(
        tool_execution_requests=[
            ToolExecutionRequest(f"c{i}", name, arguments)
            for i, (name, arguments) in enumerate(calls)
        ]
    )


def _results(model: ScriptedChatModel, count: int, request: int = 1) -> list[str | None]:
    return [m.text for m in model.requests[request].messages[-count:]]


@pytest.fixture
def stdio_toolset() -> Iterator[McpToolset]:
    with McpToolset.stdio(sys.executable, [str(SERVER), "stdio"]) as toolset:
        yield toolset


@pytest.fixture
def http_url() -> Iterator[str]:
    with serving(lambda port: [sys.executable, str(SERVER), "http", str(port)]) as port:
        yield f"http://127.0.0.1:{port}/mcp"


def test_a_stdio_servers_tools_are_offered_and_called_from_a_sync_method(
    stdio_toolset: McpToolset,
) -> None:
    model = ScriptedChatModel(
        _calls(("forecast", '{"city": "Oslo", "days": 2}'), ("broken", '{"city": "Oslo"}')),
        "done",
    )
    bot = ai_service(Bot, model=model, tools=[stdio_toolset])
    assert bot.ask("weather?") == "done"
    offered = {spec.name: spec.parameters for spec in model.requests[0].tools}
    assert set(offered) == {
        "forecast",
        "broken",
        "crash",
        "whoami",
        "refuse",
        "slow",
        "radar",
        "grow",
    }
    assert offered["forecast"]["required"] == ["city"]
    forecast, broken = _results(model, 2)
    assert forecast == "Oslo: sunny for 2 day(s)"
    # The server's error goes back to the model as the tool's result.
    assert broken is not None
    assert broken.startswith("Tool 'broken' raised McpToolError:")


def test_the_filter_chooses_the_tools_and_invalid_arguments_never_reach_the_server() -> None:
    with McpToolset.stdio(
        sys.executable, [str(SERVER), "stdio"], filter=lambda name: name == "forecast"
    ) as toolset:
        model = ScriptedChatModel(_calls(("forecast", '{"days": 2}')), "done", check_tools=False)
        ai_service(Bot, model=model, tools=[toolset]).ask("weather?")
    assert [spec.name for spec in model.requests[0].tools] == ["forecast"]
    (result,) = _results(model, 1)
    assert result is not None
    assert "Invalid arguments for tool 'forecast'" in result
    assert "'city' is a required property" in result


def test_async_methods_call_the_same_toolset(stdio_toolset: McpToolset) -> None:
    model = ScriptedChatModel(
        _calls(("forecast", '{"city": "Oslo"}'), ("forecast", '{"city": "Rome"}')), "done"
    )
    bot = ai_service(AsyncBot, model=model, tools=[stdio_toolset])

    async def main() -> str:
        # The service's own loop runs beside the toolset's: no deadlock, no loop per call.
        return await bot.ask("weather?")

    assert asyncio.run(main()) == "done"
    assert _results(model, 2) == ["Oslo: sunny for 1 day(s)", "Rome: sunny for 1 day(s)"]


def test_eight_threads_call_the_servers_tools_at_once(stdio_toolset: McpToolset) -> None:
    bots = []
    for i in range(8):
        model = ScriptedChatModel(_calls(("forecast", f'{{"city": "city {i}"}}')), "done")
        bots.append((model, ai_service(Bot, model=model, tools=[stdio_toolset])))
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def call(bot: Any) -> None:
        start.wait()
        try:
            bot.ask("weather?")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=call, args=(bot,)) for _, bot in bots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    for i, (model, _) in enumerate(bots):
        assert _results(model, 1) == [f"city {i}: sunny for 1 day(s)"]


def test_a_server_that_crashes_mid_call_fails_that_call_and_the_next_reconnects(
    stdio_toolset: McpToolset,
) -> None:
    model = ScriptedChatModel(
        _calls(("whoami", "{}")),
        "first",
        _calls(("crash", "{}")),
        "second",
        _calls(("whoami", "{}")),
        "third",
    )
    bot = ai_service(Bot, model=model, tools=[stdio_toolset])
    bot.ask("who?")
    bot.ask("crash")
    bot.ask("who now?")
    (first_pid,) = _results(model, 1, request=1)
    (crashed,) = _results(model, 1, request=3)
    (second_pid,) = _results(model, 1, request=5)
    assert crashed is not None
    assert crashed.startswith("Tool 'crash' raised")  # the error went back to the model
    assert first_pid is not None
    assert second_pid is not None
    assert first_pid.isdigit()
    assert second_pid.isdigit()
    assert first_pid != second_pid  # a new server process


def test_cancelling_an_async_call_cancels_its_tool_call_and_keeps_the_connection() -> None:
    with McpToolset.stdio(sys.executable, [str(SERVER), "stdio"], timeout=20) as toolset:
        before = ScriptedChatModel(_calls(("whoami", "{}")), "done")
        ai_service(Bot, model=before, tools=[toolset]).ask("who?")
        model = ScriptedChatModel(_calls(("slow", '{"seconds": 30}')), "done")
        bot = ai_service(AsyncBot, model=model, tools=[toolset])

        async def main() -> float:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1):
                    await bot.ask("slow?")
            return time.monotonic() - started

        # Not the 20 s of the toolset's timeout, nor the tool's 30 s.
        assert asyncio.run(main()) < 10
        after = ScriptedChatModel(_calls(("whoami", "{}")), "done")
        asyncio.run(ai_service(AsyncBot, model=after, tools=[toolset]).ask("who?"))
        assert _results(after, 1) == _results(before, 1)  # the same server process


def test_a_server_that_dies_between_calls_is_connected_again_by_the_next_call(
    stdio_toolset: McpToolset,
) -> None:
    model = ScriptedChatModel(_calls(("whoami", "{}")), "first", _calls(("whoami", "{}")), "second")
    bot = ai_service(Bot, model=model, tools=[stdio_toolset])
    bot.ask("who?")
    (first_pid,) = _results(model, 1, request=1)
    assert first_pid is not None
    os.kill(int(first_pid), signal.SIGKILL)  # no call in flight
    # Until the toolset has seen its server go (at once, once the process is gone).
    deadline = time.monotonic() + 10
    while stdio_toolset._connection.alive and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.02)
    bot.ask("who now?")
    (second_pid,) = _results(model, 1, request=3)
    assert second_pid is not None
    assert second_pid.isdigit()  # not "Tool 'whoami' raised MCPError: Connection closed"
    assert second_pid != first_pid


def test_a_toolset_from_a_tool_provider_connects_without_blocking_an_async_calls_loop(
    tmp_path: Path,
) -> None:
    started = tmp_path / "started"  # the server answers once this exists
    model = ScriptedChatModel(_calls(("whoami", "{}")), "done")

    async def main() -> None:
        async with McpToolset.stdio(
            sys.executable, [str(SERVER), "stdio", str(started)], timeout=30
        ) as toolset:
            bot = ai_service(AsyncBot, model=model, tool_provider=lambda *_: [toolset])
            # Only a loop left free while the toolset connects can let its server start.
            asyncio.get_running_loop().call_soon(started.touch)
            assert await bot.ask("who?") == "done"

    asyncio.run(main())
    (pid,) = _results(model, 1)
    assert pid is not None
    assert pid.isdigit()


def test_a_streamable_http_server_from_sync_and_async_methods(http_url: str) -> None:
    with McpToolset.http(http_url, headers={"X-Test": "yes"}) as toolset:
        model = ScriptedChatModel(
            _calls(("forecast", '{"city": "Oslo"}')),
            "done",
            _calls(("forecast", '{"city": "Rome"}')),
            "done",
        )
        ai_service(Bot, model=model, tools=[toolset]).ask("weather?")
        asyncio.run(ai_service(AsyncBot, model=model, tools=[toolset]).ask("weather?"))
    assert _results(model, 1, request=1) == ["Oslo: sunny for 1 day(s)"]
    assert _results(model, 1, request=3) == ["Rome: sunny for 1 day(s)"]


def test_a_closed_toolset_says_so() -> None:
    toolset = McpToolset.stdio(sys.executable, [str(SERVER), "stdio"])
    tools = toolset.aiservices_tools()
    asyncio.run(toolset.aclose())
    with pytest.raises(RuntimeError, match="is closed"):
        tools[0].function(city="Oslo")
    with pytest.raises(RuntimeError, match="is closed"):  # its tools are listed already
        ai_service(Bot, model=ScriptedChatModel("ok"), tools=[toolset])


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is not installed")
def test_the_reference_server_everything_from_npm() -> None:
    try:
        toolset = McpToolset.stdio("npx", ["-y", "@modelcontextprotocol/server-everything"])
        names = [tool.name for tool in toolset.aiservices_tools()]
    except Exception as error:  # the npm registry unreachable, say
        pytest.skip(f"@modelcontextprotocol/server-everything did not start: {error}")
    with toolset:
        assert "echo" in names
        model = ScriptedChatModel(_calls(("echo", '{"message": "hello"}')), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("echo")
        (result,) = _results(model, 1)
        assert result is not None
        assert "hello" in result


def test_a_protocol_error_of_one_call_leaves_the_connection_to_the_others(
    stdio_toolset: McpToolset,
) -> None:
    model = ScriptedChatModel(_calls(("slow", "{}"), ("refuse", "{}")), "done")
    bot = ai_service(AsyncBot, model=model, tools=[stdio_toolset])
    asyncio.run(bot.ask("both at once"))  # an async call runs the two concurrently
    slow, refused = _results(model, 2)
    assert refused is not None
    assert "not allowed" in refused
    assert slow is not None
    assert slow.isdigit()  # the slow call finished on the same connection
    after = ScriptedChatModel(_calls(("whoami", "{}")), "done")
    ai_service(Bot, model=after, tools=[stdio_toolset]).ask("who?")
    assert _results(after, 1) == [slow]  # the same server process


def test_a_server_that_never_answers_fails_to_list_and_closes_at_once() -> None:
    from mcp import StdioServerParameters

    silent = StdioServerParameters(
        command=sys.executable, args=["-c", "import time; time.sleep(30)"]
    )
    toolset = McpToolset(silent, timeout=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not answer within 1 s while connecting"):
        toolset.aiservices_tools()
    toolset.close()
    assert time.monotonic() - started < 10
    assert not [t for t in threading.enumerate() if t.name == "aiservices-mcp"]


def test_a_server_that_exits_at_start_says_so_plainly() -> None:
    toolset = McpToolset.stdio(sys.executable, ["-c", "import sys; sys.exit(2)"])
    try:
        with pytest.raises(ConnectionError, match=r"could not be reached: .*Connection closed"):
            ai_service(Bot, model=ScriptedChatModel("ok"), tools=[toolset])
    finally:
        toolset.close()


def test_content_that_is_not_text_reaches_the_model_described(
    stdio_toolset: McpToolset,
) -> None:
    model = ScriptedChatModel(_calls(("radar", "{}")), "done")
    ai_service(Bot, model=model, tools=[stdio_toolset]).ask("rain?")
    assert _results(model, 1) == [
        "The radar:\n[image: image/png]\n[resource link: rain.png file:///maps/rain.png]"
    ]


def test_a_result_the_client_refuses_fails_that_call_and_keeps_the_connection() -> None:
    server = Path(__file__).parent / "mcp_servers" / "schema_breaker.py"
    with McpToolset.stdio(sys.executable, [str(server)]) as toolset:
        model = ScriptedChatModel(
            _calls(("whoami", "{}")), _calls(("count", "{}")), _calls(("whoami", "{}")), "done"
        )
        ai_service(Bot, model=model, tools=[toolset]).ask("count")
        [before] = _results(model, 1, request=1)
        [refused] = _results(model, 1, request=2)
        [after] = _results(model, 1, request=3)
    assert refused is not None
    assert refused.startswith("Tool 'count' raised RuntimeError")
    assert after == before  # the same server process: its state is kept


def test_a_tool_whose_schema_is_broken_is_named_with_the_filter_that_leaves_it_out() -> None:
    server = [str(Path(__file__).parent / "mcp_servers" / "schema_breaker.py"), "bad-input"]
    with McpToolset.stdio(sys.executable, server) as toolset:
        with pytest.raises(ValueError, match="the server's tool 'typo' can't be offered") as info:
            ai_service(Bot, model=ScriptedChatModel("ok"), tools=[toolset])
        assert "filter=lambda name: name != 'typo'" in str(info.value)
        assert "McpToolset.stdio(" in str(info.value)
    with McpToolset.stdio(sys.executable, server, filter=lambda name: name != "typo") as toolset:
        model = ScriptedChatModel(_calls(("whoami", "{}")), "done")
        assert ai_service(Bot, model=model, tools=[toolset]).ask("who?") == "done"
        assert [spec.name for spec in model.requests[0].tools] == ["count", "whoami"]


def test_a_prefix_tells_two_servers_tools_of_one_name_apart() -> None:
    command = [str(SERVER), "stdio"]
    keep = {"forecast", "whoami"}.__contains__
    with (
        McpToolset.stdio(sys.executable, command, filter=keep) as first,
        McpToolset.stdio(sys.executable, command, filter=keep) as second,
        pytest.raises(InterfaceError, match="prefix="),
    ):
        ai_service(Bot, model=ScriptedChatModel("ok"), tools=[first, second])
    with (
        McpToolset.stdio(sys.executable, command, filter=keep, prefix="north_") as north,
        McpToolset.stdio(sys.executable, command, filter=keep, prefix="south_") as south,
    ):
        model = ScriptedChatModel(
            _calls(
                ("north_whoami", "{}"),
                ("south_whoami", "{}"),
                ("south_forecast", '{"city": "Rome"}'),
            ),
            "done",
        )
        ai_service(Bot, model=model, tools=[north, south]).ask("who?")
        names = [spec.name for spec in model.requests[0].tools]
        assert names == ["north_forecast", "north_whoami", "south_forecast", "south_whoami"]
        north_pid, south_pid, forecast = _results(model, 3)
    assert north_pid is not None
    assert south_pid is not None
    assert north_pid.isdigit()
    assert south_pid.isdigit()
    assert north_pid != south_pid  # two processes
    assert forecast == "Rome: sunny for 1 day(s)"


def test_the_timeout_of_a_toolset_bounds_each_call(http_url: str) -> None:
    with McpToolset.http(http_url, filter={"slow", "whoami"}.__contains__, timeout=0.5) as toolset:
        model = ScriptedChatModel(_calls(("slow", "{}")), _calls(("whoami", "{}")), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("slow?")
        amodel = ScriptedChatModel(_calls(("slow", "{}")), _calls(("whoami", "{}")), "done")
        asyncio.run(ai_service(AsyncBot, model=amodel, tools=[toolset]).ask("slow?"))
    for called in (model, amodel):
        (slow,) = _results(called, 1, request=1)
        (whoami,) = _results(called, 1, request=2)
        assert slow is not None
        assert slow.startswith("Tool 'slow' raised TimeoutError")  # the tool takes 1 s
        assert whoami is not None
        assert whoami.isdigit()  # the next call goes through


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": "5"}, "timeout must be a positive number"),
        ({"prefix": "a b"}, "prefix must be letters"),
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        McpToolset.stdio(sys.executable, [str(SERVER), "stdio"], **options)


ODD = Path(__file__).parent / "mcp_servers" / "odd.py"


def test_a_tool_listed_with_a_bare_object_schema_is_offered_with_empty_properties() -> None:
    # OpenAI refuses a function whose parameters are {"type": "object"} without properties.
    with McpToolset.stdio(sys.executable, [str(ODD), "stdio"]) as toolset:
        model = ScriptedChatModel(_calls(("regions", "{}")), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("where?")
    regions = next(spec for spec in model.requests[0].tools if spec.name == "regions")
    assert regions.parameters == {"type": "object", "properties": {}}
    assert _results(model, 1) == ["eu, us"]


def test_a_parameter_named_self_and_an_error_told_in_structured_content() -> None:
    with McpToolset.stdio(sys.executable, [str(ODD), "stdio"]) as toolset:
        model = ScriptedChatModel(
            _calls(("echo", '{"self": "me", "other": "you"}'), ("quota", "{}")), "done"
        )
        ai_service(Bot, model=model, tools=[toolset]).ask("go")
    echoed, quota = _results(model, 2)
    assert echoed == '{"other": "you", "self": "me"}'
    assert quota is not None
    assert quota.endswith('McpToolError: {"error": "quota exceeded", "retry_after": 30}')


def test_two_tools_one_name_once_made_valid_are_named_with_the_filter_that_parts_them() -> None:
    with (
        McpToolset.stdio(sys.executable, [str(ODD), "stdio", "clash"]) as toolset,
        pytest.raises(ValueError, match=r"'get.weather' and 'get_weather' are both offered") as e,
    ):
        ai_service(Bot, model=ScriptedChatModel("ok"), tools=[toolset])
    assert "filter=lambda name: name != 'get_weather'" in str(e.value)
    keep = "get.weather".__ne__
    with McpToolset.stdio(sys.executable, [str(ODD), "stdio", "clash"], filter=keep) as toolset:
        assert "get_weather" in [tool.name for tool in toolset.aiservices_tools()]


def test_a_tool_list_the_server_changes_is_listed_again() -> None:
    with McpToolset.stdio(sys.executable, [str(SERVER), "stdio"]) as toolset:
        model = ScriptedChatModel(_calls(("grow", "{}")), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("grow")
        assert "added" not in [spec.name for spec in model.requests[0].tools]
        deadline = time.monotonic() + 10
        while "added" not in [t.name for t in toolset.aiservices_tools()]:
            assert time.monotonic() < deadline, "the change was never heard of"
            time.sleep(0.05)
        later = ScriptedChatModel(_calls(("added", "{}")), "done")
        ai_service(Bot, model=later, tool_provider=lambda *_: [toolset]).ask("new?")
        assert _results(later, 1) == ["here"]


def test_a_function_that_makes_a_transport_connects_again_and_a_transport_says_it_cannot() -> None:
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    parameters = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])
    with McpToolset(lambda: stdio_client(parameters)) as toolset:
        model = ScriptedChatModel(_calls(("whoami", "{}")), _calls(("crash", "{}")), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("crash")
        again = ScriptedChatModel(_calls(("whoami", "{}")), "done")
        ai_service(Bot, model=again, tools=[toolset]).ask("who?")
        (before,), (after,) = _results(model, 1), _results(again, 1)
        assert before is not None
        assert after is not None
        assert before.isdigit()
        assert after.isdigit()
        assert before != after  # a new server process
    with McpToolset(stdio_client(parameters)) as toolset:
        model = ScriptedChatModel(_calls(("crash", "{}")), _calls(("whoami", "{}")), "done")
        ai_service(Bot, model=model, tools=[toolset]).ask("crash")
        (answer,) = _results(model, 1, request=2)
    assert answer is not None
    assert "a transport serves one connection; pass a function that makes the transport" in answer


def test_args_given_as_one_string_are_refused() -> None:
    with pytest.raises(TypeError, match=r"args must be a list of strings, one per argument"):
        McpToolset.stdio(sys.executable, f"{SERVER} stdio")  # type: ignore[arg-type]
