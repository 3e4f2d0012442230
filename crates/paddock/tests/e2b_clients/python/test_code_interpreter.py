"""`e2b-code-interpreter` (Python, pinned in requirements-interpreter.txt) against paddock's
interpreter door (port 49999 of a sandbox): cells keep state, callbacks stream output, errors,
contexts, rich results, client-side timeouts, and create-time environment variables.

The server's `code-interpreter-v1` template is the host's root (its Python has ipykernel,
matplotlib and pandas: scripts/install-deps.sh). Run through `cargo nextest run -p paddock --test
e2e e2b::`.
"""

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import ChartType


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        try:
            sbx.kill()
        except Exception:
            pass


def test_state_results_and_streamed_callbacks(sandbox):
    sandbox.run_code("x = 1")
    execution = sandbox.run_code("x + 1")
    assert execution.text == "2"
    assert execution.execution_count == 2
    seen = []
    execution = sandbox.run_code(
        "print('hello')\nimport sys\nprint('oops', file=sys.stderr)",
        on_stdout=lambda m: seen.append(("out", m.line)),
        on_stderr=lambda m: seen.append(("err", m.line)),
    )
    assert ("out", "hello\n") in seen and ("err", "oops\n") in seen
    assert execution.logs.stdout == ["hello\n"]
    assert execution.logs.stderr == ["oops\n"]


def test_errors_keep_the_context_usable(sandbox):
    execution = sandbox.run_code("1 / 0")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "ZeroDivisionError" in execution.error.traceback
    assert sandbox.run_code("40 + 2").text == "42"


def test_contexts_are_separate_and_can_be_restarted_and_removed(sandbox):
    context = sandbox.create_code_context(language="python")
    assert context.language == "python"
    sandbox.run_code("y = 5", context=context)
    assert sandbox.run_code("y", context=context).text == "5"
    assert sandbox.run_code("'y' in dir()").text == "False"
    assert context.id in [c.id for c in sandbox.list_code_contexts()]
    sandbox.restart_code_context(context)
    assert sandbox.run_code("y", context=context).error.name == "NameError"
    sandbox.remove_code_context(context)
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]


def test_a_figure_and_a_dataframe(sandbox):
    execution = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
    assert any(r.png for r in execution.results), execution
    chart = next(r.chart for r in execution.results if r.chart is not None)
    assert chart.type == ChartType.LINE
    assert [(x, y) for x, y in chart.elements[0].points] == [(1, 3), (2, 1), (3, 2)]
    boxes = sandbox.run_code("plt.figure()\nplt.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4, 5, 6]], labels=['a', 'b'])\nplt.show()")
    chart = next(r.chart for r in boxes.results if r.chart is not None)
    assert chart.type == ChartType.BOX_AND_WHISKER
    first = chart.elements[0]
    assert (first.label, first.min, first.first_quartile, first.median, first.third_quartile, first.max) == (
        "a", 1, 2.25, 3.5, 4.75, 5
    )
    assert first.outliers == [20]
    assert [e.label for e in chart.elements] == ["a", "b"]
    execution = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert "<table" in execution.results[0].html
    assert execution.results[0].is_main_result


def test_a_timeout_interrupts_the_cell_and_the_context_lives(sandbox):
    sandbox.run_code("z = 3")
    with pytest.raises(TimeoutException):
        sandbox.run_code("while True: pass", timeout=2)
    assert sandbox.run_code("z").text == "3"


def test_default_contexts_are_listed_before_anything_ran(sandbox):
    assert sorted(c.language for c in sandbox.list_code_contexts()) == ["javascript", "python"]


def test_javascript_and_bash_keep_state(sandbox):
    sandbox.run_code("const a = 40", language="javascript")
    assert sandbox.run_code("a + 2", language="js").text == "42"
    assert sandbox.run_code("const b: number = a; b + 1", language="typescript").text == "41"
    failed = sandbox.run_code("throw new RangeError('nope')", language="javascript")
    assert (failed.error.name, failed.error.value) == ("RangeError", "nope")
    sandbox.run_code("X=5", language="bash")
    assert sandbox.run_code("echo $((X * 2))", language="bash").logs.stdout == ["10\n"]


def test_a_cells_env_vars_hold_for_that_cell_only(sandbox):
    assert sandbox.run_code("import os; os.environ.get('FOO')", envs={"FOO": "bar"}).text == "'bar'"
    assert sandbox.run_code("'FOO' in os.environ").text == "False"
    js = sandbox.run_code("Deno.env.get('FOO')", language="javascript", envs={"FOO": "baz"})
    assert js.text == '"baz"'
    assert sandbox.run_code("Deno.env.get('FOO') ?? 'unset'", language="javascript").text == '"unset"'


def test_create_time_env_vars_reach_the_kernel():
    sbx = Sandbox.create(timeout=120, envs={"PADDOCK_GREETING": "hi"})
    try:
        assert sbx.run_code("import os; os.environ['PADDOCK_GREETING']").text == "'hi'"
    finally:
        sbx.kill()


def test_a_private_sandboxs_interpreter_needs_a_token(listener):
    import httpx

    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        host, port = listener
        url = f"http://{host}:{port}/contexts"
        bare = httpx.get(url, headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"})
        assert bare.status_code == 401, bare.text
        # The SDK sends the traffic token it got at create: its calls work.
        assert sbx.run_code("6 * 7").text == "42"
        assert [c.id for c in sbx.list_code_contexts()] == ["python", "javascript"]
    finally:
        sbx.kill()
