"""Fixtures for the E2B SDK tests against a real `paddock serve`.

The Rust end-to-end test `e2b::python_sdk` starts the server and runs pytest with:
  E2B_API_URL / E2B_SANDBOX_URL  the server's listener (one port, plain HTTP)
  E2B_DOMAIN                     the server's `[e2b] domain` (per-sandbox hosts for get_host)
  E2B_API_KEY                    a tenant's key, in E2B's spelling
  PADDOCK_OTHER_KEY              another tenant's key (E2B spelling)
The E2B spelling of a key is also accepted by paddock's own /v1 API (the tests read a sandbox's
egress policy there).
Nothing here talks to anything but that listener on 127.0.0.1.
"""

import os
import urllib.parse

import pytest
from e2b import Sandbox


def env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests through `cargo nextest run -p paddock --test e2e e2b::`")
    return value


@pytest.fixture(scope="session")
def listener():
    url = urllib.parse.urlparse(env("E2B_API_URL"))
    return url.hostname, url.port


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(timeout=120, metadata={"suite": "python"})
    try:
        yield sbx
    finally:
        try:
            sbx.kill()
        except Exception:
            pass


@pytest.fixture
def other_key():
    return env("PADDOCK_OTHER_KEY")
