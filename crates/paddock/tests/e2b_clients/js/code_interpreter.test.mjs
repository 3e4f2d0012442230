// E2B's own code interpreter SDK for JavaScript (`@e2b/code-interpreter`, unchanged, from npm,
// pinned in package-lock.json) driving paddock's interpreter door (port 49999 of a sandbox of the
// `code-interpreter-v1` template, the host's root with its kernels: scripts/install-deps.sh).
// Run by the Rust end-to-end test `e2b::sdk::js_code_interpreter_sdk` with `node --test`.
import assert from 'node:assert/strict'
import { after, test } from 'node:test'

import { Sandbox } from '@e2b/code-interpreter'
import { TimeoutError } from 'e2b'

const created = []

async function sandbox(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, ...opts })
  created.push(sbx)
  return sbx
}

after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})

test('cells keep state, stream through callbacks and count executions', async () => {
  const sbx = await sandbox()
  await sbx.runCode('x = 1')
  const two = await sbx.runCode('x + 1')
  assert.equal(two.text, '2')
  assert.equal(two.executionCount, 2)
  const seen = []
  const printed = await sbx.runCode("import sys\nprint('hello')\nprint('oops', file=sys.stderr)", {
    onStdout: (m) => seen.push(['out', m.line]),
    onStderr: (m) => seen.push(['err', m.line]),
  })
  assert.deepEqual(printed.logs.stdout, ['hello\n'])
  assert.deepEqual(printed.logs.stderr, ['oops\n'])
  assert.deepEqual(seen.sort(), [['err', 'oops\n'], ['out', 'hello\n']])
})

test('errors carry name, value and traceback; the context lives on', async () => {
  const sbx = await sandbox()
  const errors = []
  const failed = await sbx.runCode('1 / 0', { onError: (e) => errors.push(e.name) })
  assert.equal(failed.error.name, 'ZeroDivisionError')
  assert.equal(failed.error.value, 'division by zero')
  assert.match(failed.error.traceback, /ZeroDivisionError/)
  assert.deepEqual(errors, ['ZeroDivisionError'])
  assert.equal((await sbx.runCode('40 + 2')).text, '42')
})

test('contexts: defaults listed, separate state, restart, remove', async () => {
  const sbx = await sandbox()
  const defaults = (await sbx.listCodeContexts()).map((c) => c.language).sort()
  assert.deepEqual(defaults, ['javascript', 'python'])
  const ctx = await sbx.createCodeContext({ language: 'python' })
  assert.equal(ctx.language, 'python')
  await sbx.runCode('y = 5', { context: ctx })
  assert.equal((await sbx.runCode('y', { context: ctx })).text, '5')
  assert.equal((await sbx.runCode("'y' in dir()")).text, 'False')
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode('y', { context: ctx })).error.name, 'NameError')
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
})

test('JavaScript, TypeScript and Bash keep state too', async () => {
  const sbx = await sandbox()
  await sbx.runCode('const a = 40', { language: 'javascript' })
  assert.equal((await sbx.runCode('a + 2', { language: 'javascript' })).text, '42')
  assert.equal((await sbx.runCode('const b: number = a * 2; b', { language: 'typescript' })).text, '80')
  const logged = await sbx.runCode("console.log('from deno')", { language: 'javascript' })
  assert.deepEqual(logged.logs.stdout, ['from deno\n'])
  await sbx.runCode('N=7', { language: 'bash' })
  assert.deepEqual((await sbx.runCode('echo $((N + 1))', { language: 'bash' })).logs.stdout, ['8\n'])
})

test('a figure comes back as a PNG with its chart; a DataFrame as HTML', async () => {
  const sbx = await sandbox()
  const plot = await sbx.runCode("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.title('t')\nplt.show()")
  const figure = plot.results.find((r) => r.png)
  assert.ok(figure, JSON.stringify(plot))
  assert.equal(figure.chart.type, 'bar')
  assert.equal(figure.chart.title, 't')
  assert.deepEqual(figure.chart.elements.map((e) => [e.label, e.value]), [['a', 3], ['b', 5]])
  const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  assert.match(frame.results[0].html, /<table/)
})

test("a cell's envs hold for that cell only", async () => {
  const sbx = await sandbox()
  assert.equal((await sbx.runCode("import os; os.environ.get('FOO')", { envs: { FOO: 'bar' } })).text, "'bar'")
  assert.equal((await sbx.runCode("'FOO' in os.environ")).text, 'False')
  const js = await sbx.runCode("Deno.env.get('FOO')", { language: 'javascript', envs: { FOO: 'baz' } })
  assert.equal(js.text, '"baz"')
})

test('a client timeout stops the cell; the context lives on', async () => {
  const sbx = await sandbox()
  await sbx.runCode('z = 3')
  await assert.rejects(sbx.runCode('while True: pass', { timeoutMs: 2_000 }), (e) => e instanceof TimeoutError)
  assert.equal((await sbx.runCode('z')).text, '3')
})
