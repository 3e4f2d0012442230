// Driver of bench/e2b_sdks.py for E2B's JavaScript SDK (the pinned one in
// crates/paddock/tests/e2b_clients/js). Reads E2B_* (the SDK's own configuration) and BENCH_* from the
// environment and prints one JSON object of samples in milliseconds:
//   create  {"create_run": [...]}   Sandbox.create() then commands.run('echo hi'), BENCH_CREATES times
//   live    {"run_true": [...], "files": [...]}
//           commands.run('true') BENCH_RUNS times; 1 MiB files.write + read BENCH_FILES times (checked)
// Each sandbox it creates is killed before it exits.
import { createRequire } from 'node:module'
import { randomBytes } from 'node:crypto'
import { fileURLToPath, pathToFileURL } from 'node:url'
import path from 'node:path'

const here = path.dirname(fileURLToPath(import.meta.url))
const jsDir = path.join(here, '..', 'crates/paddock/tests/e2b_clients/js')
const require = createRequire(path.join(jsDir, 'package.json'))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const MIB = 1 << 20
const env = (k) => Number(process.env[k])

async function createRun(n) {
  const out = []
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    const sbx = await Sandbox.create({ timeoutMs: 600_000 })
    const r = await sbx.commands.run('echo hi')
    out.push(performance.now() - t)
    if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
    await sbx.kill()
  }
  return out
}

async function live(runs, files) {
  const sbx = await Sandbox.create({ timeoutMs: 600_000 })
  try {
    const runTrue = []
    for (let i = 0; i < runs; i++) {
      const t = performance.now()
      const r = await sbx.commands.run('true')
      runTrue.push(performance.now() - t)
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
    }
    const data = randomBytes(MIB)
    const moved = []
    for (let i = 0; i < files; i++) {
      const p = `/tmp/bench-js-${i}.bin`
      const t = performance.now()
      await sbx.files.write(p, data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
      const back = await sbx.files.read(p, { format: 'bytes' })
      moved.push(performance.now() - t)
      if (Buffer.compare(Buffer.from(back), data) !== 0) throw new Error(`read back ${back.length} bytes differ`)
    }
    return { run_true: runTrue, files: moved }
  } finally {
    await sbx.kill()
  }
}

const what = process.env.BENCH_WHAT
let out
if (what === 'create') out = { create_run: await createRun(env('BENCH_CREATES')) }
else if (what === 'live') out = await live(env('BENCH_RUNS'), env('BENCH_FILES'))
else throw new Error(`unknown BENCH_WHAT ${what}`)
console.log(JSON.stringify(out))
