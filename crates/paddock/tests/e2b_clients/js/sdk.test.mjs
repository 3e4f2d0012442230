// E2B's own JavaScript SDK (unchanged, from npm, pinned in package-lock.json) driving paddock:
// every call goes through the real client library to a real `paddock serve` and real sandboxes.
// Run by the Rust end-to-end test `e2b::sdk::js_sdk_newest` with `node --test`; the environment it
// sets is described in ../python/conftest.py. Waiting is for conditions, with a deadline as a
// safety net, never a sleep standing in for synchronisation.
import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import http from 'node:http'

import { CommandExitError, NotFoundError, AuthenticationError, Sandbox, TimeoutError } from 'e2b'

const DEADLINE_MS = 30_000
const MISSING = 'sb-00000000000000ff'
const api = new URL(process.env.E2B_API_URL)
const domain = process.env.E2B_DOMAIN
const created = []

async function sandbox(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'js' }, ...opts })
  created.push(sbx)
  return sbx
}

after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})

async function until(what, predicate) {
  const end = Date.now() + DEADLINE_MS
  for (;;) {
    const v = await predicate()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

// GET through the listener with an explicit Host (a per-sandbox host, no DNS involved).
function rawGet(host, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: api.hostname, port: api.port, path, headers: { Host: host, ...headers } },
      (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
      },
    )
    req.on('error', reject)
    req.end()
  })
}

test('commands: output, exit codes, env, cwd, user, timeout', async () => {
  const sbx = await sandbox({ envs: { SANDBOX_WIDE: 'yes' } })
  const r = await sbx.commands.run('echo hi; echo err >&2')
  assert.deepEqual([r.stdout, r.stderr, r.exitCode], ['hi\n', 'err\n', 0])
  await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)
  assert.equal((await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })).stdout, 'bar\n')
  assert.equal((await sbx.commands.run('echo $SANDBOX_WIDE')).stdout, 'yes\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1000 }), TimeoutError)
})

test('commands: background, stdin, list, reconnect, kill', async () => {
  const sbx = await sandbox()
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'hello\n')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'hello\n')

  const w = await sbx.commands.run('while [ ! -e /tmp/go ]; do sleep 0.02; done; echo done', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === w.pid))
  const again = await sbx.commands.connect(w.pid)
  await sbx.files.write('/tmp/go', '')
  assert.equal((await again.wait()).stdout, 'done\n')

  const k = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await sbx.commands.kill(k.pid), true)
  await assert.rejects(k.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(k.pid), false)
})

test('pty: input, output, resize', async () => {
  const sbx = await sandbox()
  let out = ''
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += Buffer.from(d).toString() } })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
  await sbx.pty.resize(h.pid, { cols: 101, rows: 30 })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('tput cols\nexit\n'))
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.match(out, /pty-42/)
  assert.match(out, /101/)
})

test('files: write, read, list, stat, rename, remove, watch', async () => {
  const sbx = await sandbox()
  const info = await sbx.files.write('notes/a.txt', 'hello')
  assert.equal(info.path, '/home/user/notes/a.txt')
  assert.equal(await sbx.files.read('notes/a.txt'), 'hello')
  const blob = new Uint8Array(4096).map((_, i) => i % 256)
  await sbx.files.write('/tmp/blob.bin', blob.buffer)
  assert.deepEqual(new Uint8Array(await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })), blob)
  assert.equal(await sbx.files.makeDir('/home/user/tree/sub'), true)
  await sbx.files.write('/home/user/tree/sub/deep.txt', 'x')
  const deep = (await sbx.files.list('/home/user/tree', { depth: 2 })).map((e) => e.path).sort()
  assert.deepEqual(deep, ['/home/user/tree/sub', '/home/user/tree/sub/deep.txt'])
  const st = await sbx.files.getInfo('/home/user/notes/a.txt')
  assert.equal(st.size, 5)
  await sbx.files.rename('/home/user/notes/a.txt', '/home/user/moved/b.txt')
  assert.equal(await sbx.files.exists('/home/user/moved/b.txt'), true)
  await sbx.files.remove('/home/user/moved')
  assert.equal(await sbx.files.exists('/home/user/moved/b.txt'), false)
  await assert.rejects(sbx.files.read('/home/user/never-was'), NotFoundError)

  await sbx.files.makeDir('/home/user/watched')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/watched', (e) => { events.push(e) })
  await sbx.files.write('/home/user/watched/new.txt', 'data')
  await until('a watch event', () => events.some((e) => e.name === 'new.txt'))
  await handle.stop()
})

test('lifecycle: info, timeout, list with metadata and paging, pause and resume, metrics, kill', async () => {
  const run = Math.random().toString(16).slice(2, 14)
  const a = await sandbox({ metadata: { run, n: '1' } })
  const b = await sandbox({ metadata: { run, n: '2' } })
  const info = await a.getInfo()
  assert.deepEqual(info.metadata, { run, n: '1' })
  await a.setTimeout(600_000)
  assert.ok((await a.getInfo()).endAt > info.endAt)

  const pages = Sandbox.list({ query: { metadata: { run } }, limit: 1 })
  const ids = []
  while (pages.hasNext) ids.push(...(await pages.nextItems()).map((s) => s.sandboxId))
  assert.deepEqual(ids, [b.sandboxId, a.sandboxId])

  assert.ok((await a.getMetrics()).length > 0)
  await a.files.write('/home/user/kept.txt', 'kept')
  await a.pause()
  assert.equal(await a.isRunning(), false)
  const resumed = await Sandbox.connect(a.sandboxId)
  assert.equal(await resumed.files.read('/home/user/kept.txt'), 'kept')

  await b.kill()
  assert.equal(await Sandbox.kill(b.sandboxId), false)
})

test('errors: a missing sandbox, a bad key; tenancy', async () => {
  await assert.rejects(Sandbox.connect(MISSING), NotFoundError)
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(76) }), AuthenticationError)
  const sbx = await sandbox()
  const other = { apiKey: process.env.PADDOCK_OTHER_KEY }
  await assert.rejects(Sandbox.connect(sbx.sandboxId, other), NotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId, other), false)
  assert.equal(await sbx.isRunning(), true)
})

// The sandbox's egress policy as paddock's own API shows it (the E2B key works there too).
function v1Network(id) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: api.hostname,
        port: api.port,
        path: `/v1/sandboxes/${id}/network`,
        headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` },
      },
      (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(Buffer.concat(chunks).toString()) }))
      },
    )
    req.on('error', reject)
    req.end()
  })
}

test('network: allow and deny lists, update, no internet access', async () => {
  const sbx = await sandbox({ network: { allowOut: ['allowed.test', '192.0.2.0/24'], denyOut: ['0.0.0.0/0'] } })
  let r = await v1Network(sbx.sandboxId)
  assert.equal(r.status, 200, JSON.stringify(r.body))
  let allowed = JSON.stringify(r.body.policy.allow)
  assert.ok(allowed.includes('allowed.test') && allowed.includes('192.0.2.0/24'), allowed)
  // Names off the list are refused by the sandbox's own resolver (no question leaves it).
  const lookup = await sbx.commands.run(
    `python3 -c "import socket
try:
    socket.getaddrinfo('denied.test', 80); print('RESOLVED')
except OSError as e:
    print('REFUSED', e)"`,
  )
  assert.match(lookup.stdout, /^REFUSED/)
  await sbx.updateNetwork({ allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] })
  r = await v1Network(sbx.sandboxId)
  allowed = JSON.stringify(r.body.policy.allow)
  assert.ok(allowed.includes('other.test') && !allowed.includes('allowed.test'), allowed)
  // Without internet access there is no link at all: nothing but loopback.
  const closed = await sandbox({ allowInternetAccess: false })
  const connect = await closed.commands.run(
    `python3 -c "import socket
try:
    socket.create_connection(('192.0.2.1', 80), timeout=5); print('CONNECTED')
except OSError as e:
    print('UNREACHABLE', e)"`,
  )
  assert.match(connect.stdout, /^UNREACHABLE.*unreachable/i)
})

test('ports: getHost reaches a web server inside', async () => {
  const sbx = await sandbox()
  await sbx.files.write('/home/user/www/index.html', 'from inside')
  await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
  const r = await until('the web server', async () => {
    const r = await rawGet(host, '/index.html')
    return r.status === 200 ? r : null
  })
  assert.equal(r.body, 'from inside')
})
