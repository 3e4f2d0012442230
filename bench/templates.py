#!/usr/bin/env python3
"""Templates built from registry images: pull + unpack against skopeo + umoci, and sandbox creation
from a 1 GB image template against the default template, in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/templates.py [--runs 5] [--burst 30] [--multi-mb 250] [--big-mb 1024]

Builds two images with umoci (no Docker): `multi` (5 layers, `--multi-mb` of random-byte files, a
static busybox and its applets in the first layer) and `big` (8 layers, `--big-mb`), and pushes them
with skopeo to a `docker-registry` it starts on 127.0.0.1 (plain HTTP, no auth; paddock's
`[registry] insecure` names it). Then, against its own `paddock serve` (no warm pool):
  1. pull + unpack, cold layer cache: wall time of `POST /v1/templates` (Accept: application/json)
     for `multi`, the template deleted between runs (which removes its cached layers; checked);
     `--runs` times, median. Peer, interleaved: `skopeo copy docker://... oci:DIR:tag` then
     `umoci unpack --image DIR:tag BUNDLE` (as root), removed between runs. Both write under
     /var/tmp (paddock's pool is a loop-mounted btrfs image there).
     Warm: `POST /v1/templates` of a second name from the same image while the first exists (every
     layer cached), `--runs` times, median. One NDJSON build of each kind gives the breakdown (pull,
     layers).
  2. create -> first output: POST /v1/sandboxes then exec `echo ready` (NDJSON), timed to the first
     stdout line, for the `default` template (host root) and a template built from `big`, interleaved,
     `--burst` each, cold (no warm pool; the build's writes flushed first), p50 / p99 and the ratio.
  3. the same with warm pools: a second server with `[templates.bigpool] image = <big>` and pools of
     `--burst`+2 for it and `default`, creates claimed from the pools (checked), interleaved.
  4. a recipe of 5 `RUN` steps on `multi`: one cold build, then `--runs` rebuilds under new names
     with every step cached (checked: no pull, no step run), median.
Prints a JSON summary. Everything it made is removed at the end (sandboxes, templates, server and
state dir, registry process and storage, image layouts, peer directories).
"""
import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import threading
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import Server, create_then_first_stdout, summary  # noqa: E402  (same server setup, readers and percentiles as api.py)

WORK_DIR = "/var/tmp"  # same file system as the server's state directory (and its pool image)
APPLETS = ["sh", "echo", "cat", "ls", "true", "env", "id", "pwd", "sleep", "test", "mkdir", "rm"]


def run(argv, **kw):
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s%s" % (" ".join(argv), out.returncode, out.stdout, out.stderr))
    return out.stdout


def free_gib(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / (1 << 30)


def ensure_free(gib, what):
    """Stops (cleaning up) rather than fill a disk other work shares."""
    if free_gib(WORK_DIR) < gib:
        raise RuntimeError("%s needs about %.1f GiB free under %s; %.1f GiB left" % (what, gib, WORK_DIR, free_gib(WORK_DIR)))


def median_ms(xs):
    return round(statistics.median(xs), 1)


# --- the registry -------------------------------------------------------------------------------

class Registry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1, plain HTTP, no auth."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="paddock-bench-registry-", dir=WORK_DIR)
        os.mkdir(os.path.join(self.dir, "storage"))
        self.proc = None
        for _attempt in range(3):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
            s.close()
            config = os.path.join(self.dir, "config.yml")
            with open(config, "w") as f:
                f.write("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
                        "storage:\n  filesystem:\n    rootdirectory: %s/storage\n"
                        "http:\n  addr: 127.0.0.1:%d\n  secret: paddock-bench\n" % (self.dir, self.port))
            self.log = open(os.path.join(self.dir, "registry.log"), "w")
            self.proc = subprocess.Popen(["docker-registry", "serve", config], stdin=subprocess.DEVNULL,
                                         stdout=self.log, stderr=self.log)
            if self.wait_ready():
                return
            self.kill()
        raise RuntimeError("docker-registry did not start: %s" % open(os.path.join(self.dir, "registry.log")).read())

    def wait_ready(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/v2/")
                if c.getresponse().status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    @property
    def host(self):
        return "127.0.0.1:%d" % self.port

    def push(self, layout, tag, repo):
        run(["skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false",
             "oci:%s:%s" % (layout, tag), "docker://%s/%s:%s" % (self.host, repo, tag)])
        return "%s/%s:%s" % (self.host, repo, tag)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def remove(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- images -------------------------------------------------------------------------------------

def write_random_files(root, target_bytes, rng):
    """Files of random bytes totalling `target_bytes`: 95% small (0.5-16 KiB), 5% large
    (128 KiB-2 MiB), 100 to a directory. Returns (files, bytes)."""
    written = files = 0
    while written < target_bytes:
        if rng.random() < 0.95:
            size = rng.randint(512, 16 << 10)
        else:
            size = rng.randint(128 << 10, 2 << 20)
        size = min(size, target_bytes - written) or 1
        d = os.path.join(root, "d%03d" % (files // 100))
        if files % 100 == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "f%05d.bin" % files), "wb") as f:
            f.write(os.urandom(size))
        written += size
        files += 1
    return files, written


def build_image(registry, name, layers, total_mb, seed):
    """Builds image `name:v1` with umoci (layer 0: busybox, its applets, /etc/passwd and files;
    then files only), pushes it, removes the layout. Returns the reference and what it holds."""
    work = tempfile.mkdtemp(prefix="paddock-bench-image-", dir=WORK_DIR)
    try:
        layout = os.path.join(work, "layout")
        bundle = os.path.join(work, "bundle")
        run(["umoci", "init", "--layout", layout])
        run(["umoci", "new", "--image", layout + ":base"])
        run(["umoci", "unpack", "--image", layout + ":base", bundle])
        rootfs = os.path.join(bundle, "rootfs")
        rng = random.Random(seed)
        per_layer = (total_mb << 20) // layers
        files = content = 0
        for i in range(layers):
            if i == 0:
                for d in ("bin", "etc", "tmp", "home/app"):
                    os.makedirs(os.path.join(rootfs, d), exist_ok=True)
                shutil.copy("/bin/busybox", os.path.join(rootfs, "bin/busybox"))
                for applet in APPLETS:
                    os.symlink("busybox", os.path.join(rootfs, "bin", applet))
                with open(os.path.join(rootfs, "etc/passwd"), "w") as f:
                    f.write("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n")
                with open(os.path.join(rootfs, "etc/group"), "w") as f:
                    f.write("root:x:0:\napp:x:1000:\n")
            n, b = write_random_files(os.path.join(rootfs, "data", "layer%d" % i), per_layer, rng)
            files += n
            content += b
            run(["umoci", "repack", "--refresh-bundle", "--image", layout + ":v1", bundle])
        run(["umoci", "config", "--image", layout + ":v1", "--config.env=PATH=/bin",
             "--config.workingdir=/home/app", "--config.user=app", "--config.cmd=/bin/sh",
             "--os=linux", "--architecture=amd64"])
        shutil.rmtree(bundle)
        ref = registry.push(layout, "v1", "bench/" + name)
        return ref, {"layers": layers, "files": files, "content_mb": round(content / (1 << 20), 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the server ---------------------------------------------------------------------------------

class TemplateServer(Server):
    """api.py's server, with a `[registry]` section naming the loopback registry as plain HTTP;
    with `pooled_image`, also a configured template `bigpool` built from it, and warm pools of
    `warm_pool` for it and `default`."""

    def __init__(self, registry_host, pooled_image=None, warm_pool=0):
        self.registry_host = registry_host
        self.pooled_image = pooled_image
        self.audit_seq = 0
        super().__init__(warm_pool=warm_pool)

    def write_config(self, f):
        super().write_config(f)
        f.write('[registry]\ninsecure = ["%s"]\nmax_image = "16G"\ntimeout = "1h"\n' % self.registry_host)
        if self.pooled_image:
            f.write('[templates.bigpool]\nimage = "%s"\nwarm_pool = %d\n' % (self.pooled_image, self.warm_pool))

    def wait_template_pool(self, template, n, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.request("GET", "/metrics", accept="text/plain")
            text = r.read().decode()
            for line in text.splitlines():
                if line.startswith('paddock_warm_pool_size{template="%s"}' % template) and int(float(line.split()[-1])) >= n:
                    return
            time.sleep(0.2)
        raise RuntimeError("the %s warm pool did not fill to %d" % (template, n))

    def build(self, name, ref):
        """POST /v1/templates (JSON answer); returns (ms, template info, layers the cache had)."""
        t = time.perf_counter()
        info = self.json("POST", "/v1/templates", {"name": name, "from": ref}, ok=(201,))
        ms = (time.perf_counter() - t) * 1000
        return ms, info, self.last_build_cached_layers()

    def build_streamed(self, name, ref):
        """POST /v1/templates (NDJSON): each event with its time since the request, in ms."""
        t = time.perf_counter()
        r = self.request("POST", "/v1/templates", {"name": name, "from": ref}, accept="application/x-ndjson")
        if r.status != 200:
            raise RuntimeError("build %s -> %d %s" % (name, r.status, r.read()[:300]))
        events = []
        while True:
            line = r.readline()
            if not line:
                break
            e = json.loads(line)
            events.append((round((time.perf_counter() - t) * 1000, 1), e))
        r.read()
        if events[-1][1]["event"] != "done":
            raise RuntimeError("build %s failed: %s" % (name, events[-1][1]))
        return events

    def last_build_cached_layers(self):
        page = self.json("GET", "/v1/audit?action=template.build&limit=1000&after_seq=%d" % self.audit_seq)
        rows = page["records"]
        if not rows:
            raise RuntimeError("no template.build audit row")
        self.audit_seq = rows[-1]["seq"]
        return rows[-1]["detail"].get("cached_layers")

    def delete_template(self, name):
        self.json("DELETE", "/v1/templates/" + name, ok=(204,))

    def cached_layer_dirs(self):
        path = os.path.join(self.state, "pool", "layers")
        return len(os.listdir(path)) if os.path.isdir(path) else 0


def sync():
    """Flushes dirty pages so one run's writeback does not land in the next one's time."""
    os.sync()


def peer_pull_unpack(ref, tag):
    """skopeo copy to an OCI layout, then umoci unpack (as root): the same end state by hand.
    Returns (total ms, skopeo's part)."""
    d = tempfile.mkdtemp(prefix="paddock-bench-peer-", dir=WORK_DIR)
    try:
        t = time.perf_counter()
        run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", "docker://" + ref,
             "oci:%s/layout:%s" % (d, tag)])
        pulled = time.perf_counter()
        run(["umoci", "unpack", "--image", "%s/layout:%s" % (d, tag), d + "/bundle"])
        return (time.perf_counter() - t) * 1000, (pulled - t) * 1000
    finally:
        shutil.rmtree(d, ignore_errors=True)
        sync()


def breakdown(events):
    """Pull and unpack phases of a streamed build, from its event times."""
    pulling = next(ms for ms, e in events if e["event"] == "pulling")
    pulled = next(ms for ms, e in events if e["event"] == "pulled")
    layers = [(ms, e) for ms, e in events if e["event"] == "layer"]
    done = events[-1][0]
    return {
        "pulling_event_ms": pulling,
        "pulled_event_ms": pulled,
        "last_layer_ms": layers[-1][0] if layers else None,
        "done_ms": done,
        "layers_cached": sum(1 for _, e in layers if e["cached"]),
        "layers": len(layers),
    }


def pull_unpack(server, ref, runs):
    # Warm-up, untimed: binaries, the registry's blobs in the page cache, the server's first build.
    server.build("multi-warmup", ref)
    server.delete_template("multi-warmup")
    peer_pull_unpack(ref, "v1")
    sync()
    paddock, peer, peer_skopeo, sizes = [], [], [], []
    for i in range(runs):
        assert server.cached_layer_dirs() == 0, "the layer cache is not empty before a cold build"
        order = ("paddock", "peer") if i % 2 == 0 else ("peer", "paddock")
        for kind in order:
            if kind == "paddock":
                ms, info, cached = server.build("multi", ref)
                if cached != 0:
                    raise RuntimeError("a cold build found %r layers cached" % cached)
                paddock.append(ms)
                sizes.append(info.get("size_bytes"))
                server.delete_template("multi")
                sync()
            else:
                total, skopeo = peer_pull_unpack(ref, "v1")
                peer.append(total)
                peer_skopeo.append(skopeo)
    cold_stream = breakdown(server.build_streamed("multi", ref))
    # Warm: a second name from the same image while `multi` holds every layer.
    warm = []
    for _ in range(runs):
        ms, _info, cached = server.build("multi-again", ref)
        if cached != len(_info["layers"]):
            raise RuntimeError("a warm build found %r of %d layers cached" % (cached, len(_info["layers"])))
        warm.append(ms)
        server.delete_template("multi-again")
        sync()
    warm_stream = breakdown(server.build_streamed("multi-again", ref))
    server.delete_template("multi-again")
    server.delete_template("multi")
    sync()
    if server.cached_layer_dirs() != 0:
        raise RuntimeError("deleting the last template left cached layers")
    size = sizes[0] or 0
    return {
        "image_bytes_compressed": size,
        "paddock_cold_ms": {"median": median_ms(paddock), "runs": [round(x, 1) for x in paddock]},
        "skopeo_umoci_ms": {"median": median_ms(peer), "runs": [round(x, 1) for x in peer]},
        "peer_skopeo_copy_part_ms": {"median": median_ms(peer_skopeo), "runs": [round(x, 1) for x in peer_skopeo]},
        "ratio_paddock_over_peer": round(statistics.median(paddock) / statistics.median(peer), 3),
        "paddock_cold_mib_per_s": round(size / (1 << 20) / (statistics.median(paddock) / 1000), 1),
        "paddock_warm_ms": {"median": median_ms(warm), "runs": [round(x, 1) for x in warm]},
        "cold_breakdown_ndjson": cold_stream,
        "warm_breakdown_ndjson": warm_stream,
    }


def warm_creation(registry_host, big_ref, burst):
    """Create -> first output claimed from warm pools: `default` and a configured template built
    from the 1 GB image (`bigpool`), interleaved, `burst` each; pools of burst + 2."""
    server = TemplateServer(registry_host, pooled_image=big_ref, warm_pool=burst + 2)
    try:
        server.wait_template_pool("bigpool", burst + 2)
        server.wait_template_pool("default", burst + 2)
        times = {"default": [], "bigpool": []}
        ids = []
        for i in range(burst):
            for template in (("default", "bigpool") if i % 2 == 0 else ("bigpool", "default")):
                ms, sb = create_first_output(server, template)
                times[template].append(ms)
                ids.append(sb)
        delete_sandboxes(server, ids)
        claims = [r for r in server.json("GET", "/v1/audit?action=sandbox.create&limit=1000")["records"]
                  if r["detail"].get("source") == "pool"]
        if len(claims) != 2 * burst:
            raise RuntimeError("%d of %d creates were claims from the pools" % (len(claims), 2 * burst))
        out = {"default": summary(times["default"]), "big_1g_image": summary(times["bigpool"])}
        out["ratio_big_over_default_p50"] = round(
            statistics.median(times["bigpool"]) / statistics.median(times["default"]), 3)
        return out
    finally:
        server.stop()


def recipe_rebuild(server, ref, runs, steps):
    """A recipe of `steps` RUN steps on `ref`: one cold build, then `runs` rebuilds under new names
    with every step cached (nothing pulled or run: checked on the NDJSON events of one)."""
    lines = ["FROM %s" % ref, "USER root"]
    lines += ["RUN echo step-%d > /tmp/step-%d" % (i, i) for i in range(steps)]
    recipe = "\n".join(lines) + "\n"
    t = time.perf_counter()
    server.json("POST", "/v1/templates", {"name": "recipe-cold", "recipe": recipe})
    cold_ms = (time.perf_counter() - t) * 1000
    times = []
    for i in range(runs):
        name = "recipe-again-%d" % i
        t = time.perf_counter()
        server.json("POST", "/v1/templates", {"name": name, "recipe": recipe})
        times.append((time.perf_counter() - t) * 1000)
        server.delete_template(name)
    r = server.request("POST", "/v1/templates", {"name": "recipe-check", "recipe": recipe}, accept="application/x-ndjson")
    events = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    kinds = [e["event"] for e in events]
    if "pulling" in kinds or any(e["event"] == "step" and not e["cached"] for e in events) or kinds[-1] != "done":
        raise RuntimeError("a cached rebuild pulled or ran something: %r" % kinds)
    server.delete_template("recipe-check")
    server.delete_template("recipe-cold")
    return {"steps": steps, "cold_ms": round(cold_ms, 1),
            "cached_rebuild_ms": {"median": median_ms(times), "runs": [round(x, 1) for x in times]}}


def create_first_output(server, template):
    return create_then_first_stdout(server, {"template": template}, ["echo", "ready"], "ready\n")


def delete_sandboxes(server, ids):
    for i in ids:
        server.json("DELETE", "/v1/sandboxes/" + i, ok=(204,))


def creation(server, ref, burst, big_mb):
    ensure_free(big_mb * 2.2 / 1024 + 0.75, "building the big template")
    ms_build, info, _cached = server.build("big", ref)
    build = {"cold_build_ms": round(ms_build, 1), "image_bytes_compressed": info.get("size_bytes"),
             "layers": len(info.get("layers", []))}
    # The build wrote ~1 GB: flush it first, so the creates below are not measured against the
    # build's own writeback (a cost of the build, paid once).
    os.sync()
    # Warm-up, untimed: one of each; the image's sandbox runs as the image's user.
    ids = [create_first_output(server, "default")[1], create_first_output(server, "big")[1]]
    who = server.json("POST", "/v1/sandboxes/%s/exec" % ids[1], {"argv": ["id", "-un"]})
    if who.get("stdout") != "app\n":
        raise RuntimeError("a sandbox of the big template runs as %r, not the image's user app" % who)
    delete_sandboxes(server, ids)
    samples = {"default": [], "big": []}
    ids = []
    for i in range(burst):
        for template in (("default", "big") if i % 2 == 0 else ("big", "default")):
            ms, sid = create_first_output(server, template)
            samples[template].append(ms)
            ids.append(sid)
    # 409 while its sandboxes exist.
    r = server.request("DELETE", "/v1/templates/big")
    r.read()
    in_use_status = r.status
    delete_sandboxes(server, ids)
    server.delete_template("big")
    return {
        "big_template": build,
        "default": summary(samples["default"]),
        "big_1g_image": summary(samples["big"]),
        "ratio_big_over_default_p50": round(statistics.median(samples["big"]) / statistics.median(samples["default"]), 3),
        "ratio_big_over_default_p99": round(summary(samples["big"])["p99_ms"] / summary(samples["default"])["p99_ms"], 3),
        "delete_in_use_status": in_use_status,
        "note": "cold creates (no warm pool; create_to_first_output_warm has the pooled figures)",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--burst", type=int, default=30)
    ap.add_argument("--multi-mb", type=int, default=250)
    ap.add_argument("--multi-layers", type=int, default=5)
    ap.add_argument("--big-mb", type=int, default=1024)
    ap.add_argument("--big-layers", type=int, default=8)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/templates.py needs root")
    # Registry storage (both images) + the server's pulled blobs and unpacked tree of `big`.
    need = (args.big_mb * 3 + args.multi_mb * 2) / 1024 * 1.1 + 0.5
    if free_gib(WORK_DIR) < need:
        sys.exit("bench/templates.py needs about %.1f GiB free under %s (%.1f GiB)" % (need, WORK_DIR, free_gib(WORK_DIR)))
    results = {"load_avg_start": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}
    # The 1-minute load average every 10 s: other work on the host shows here.
    loads = []
    stop_sampling = threading.Event()

    def sample():
        while not stop_sampling.wait(10):
            loads.append(os.getloadavg()[0])
    threading.Thread(target=sample, daemon=True).start()
    registry = server = None
    try:
        registry = Registry()
        t = time.perf_counter()
        multi_ref, multi = build_image(registry, "multi", args.multi_layers, args.multi_mb, 1)
        ensure_free(args.big_mb * 2.2 / 1024 + 0.75, "building the big image")
        big_ref, big = build_image(registry, "big", args.big_layers, args.big_mb, 2)
        results["images"] = {"multi": multi, "big": big, "build_and_push_s": round(time.perf_counter() - t, 1)}
        server = TemplateServer(registry.host)
        results["pull_unpack_multi"] = pull_unpack(server, multi_ref, args.runs)
        results["create_to_first_output"] = creation(server, big_ref, args.burst, args.big_mb)
        results["recipe_rebuild"] = recipe_rebuild(server, multi_ref, args.runs, 5)
        for sb in server.json("GET", "/v1/sandboxes?limit=1000")["sandboxes"]:
            server.json("DELETE", "/v1/sandboxes/" + sb["id"], ok=(204, 404, 409))
        for tpl in server.json("GET", "/v1/templates")["templates"]:
            if tpl.get("id"):
                server.json("DELETE", "/v1/templates/" + tpl["name"], ok=(204, 404, 409))
        server.stop()
        server = None
        results["create_to_first_output_warm"] = warm_creation(registry.host, big_ref, args.burst)
        results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
        results["load_1m_during"] = {"min": min(loads, default=None), "max": max(loads, default=None),
                                     "median": statistics.median(loads) if loads else None}
    finally:
        stop_sampling.set()
        if server is not None:
            try:
                for sb in server.json("GET", "/v1/sandboxes?limit=1000")["sandboxes"]:
                    server.json("DELETE", "/v1/sandboxes/" + sb["id"], ok=(204, 404, 409))
                for tpl in server.json("GET", "/v1/templates")["templates"]:
                    if tpl.get("id"):
                        server.json("DELETE", "/v1/templates/" + tpl["name"], ok=(204, 404, 409))
            except Exception as e:  # the server's stop and state removal below still run
                print("cleanup through the API failed: %s" % e, file=sys.stderr)
            server.stop()
        if registry is not None:
            registry.remove()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
