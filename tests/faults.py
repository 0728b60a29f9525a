"""Faults at the HTTP level, for mounts on the emulator: rules the fault proxy applies.

The proxy (`benchmarks.shaping.ShapingProxy` with ``faults=``) sits between the real
client and the real emulator; the daemon reaches it through ``--custom-endpoint``, the
code path production uses. Each request's method and target are matched against the
rules in order; the first rule that matches and fires decides what happens to it
(`benchmarks.shaping.Action`: an HTTP status, a reset, a truncated response, a stall).

    faults = Faults(Rule(Action(status=503), method="GET", target="alt=media", rate=0.1))

Rules fire by rate (a seeded random generator: a failing run can be repeated), by
``nth`` (only the Nth request that matches) or ``after`` (not the first N), and at most
``times`` times. ``stop()``
turns every rule off (the link heals) without restarting anything.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

import pytest

from benchmarks.shaping import Action, ShapingProxy
from tierfs.cli.emulator import Emulator

__all__ = ["Action", "FaultProxy", "Faults", "Rule"]

UPLOADS = r"^/upload/"
MEDIA = r"alt=media"


@dataclass
class Rule:
    """When to apply ``action``: all of the given conditions hold."""

    action: Action
    method: str | None = None
    target: str | None = None  # a regular expression searched in the decoded target
    nth: int | None = None  # fire on this match only (1-based)
    after: int = 0  # let this many matches pass first
    times: int | None = None  # fire at most this many times
    rate: float = 1.0
    matched: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        return self.target is None or re.search(self.target, target) is not None


class Faults:
    """The rules of one proxy; called from its pump threads, hence the lock."""

    def __init__(self, *rules: Rule, seed: int = 0) -> None:
        self.rules = list(rules)
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.stopped = False
        self.seen: list[tuple[str, str]] = []  # every request: (method, decoded target)
        self.log: list[str] = []  # every fault: "METHOD target: action" (for failure messages)

    def add(self, rule: Rule) -> Rule:
        with self.lock:
            self.rules.append(rule)
        return rule

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def __call__(self, method: str, target: str) -> Action | None:
        decoded = unquote(target)
        with self.lock:
            self.seen.append((method, decoded))
            if self.stopped:
                return None
            for rule in self.rules:
                if not rule.matches(method, decoded):
                    continue
                rule.matched += 1
                if rule.nth is not None and rule.matched != rule.nth:
                    continue
                if rule.matched <= rule.after:
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if rule.rate < 1.0 and self.random.random() >= rule.rate:
                    continue
                rule.fired += 1
                self.log.append(f"{method} {decoded}: {rule.action}")
                return rule.action
        return None

    @property
    def fired(self) -> int:
        with self.lock:
            return sum(rule.fired for rule in self.rules)


class FaultProxy:
    """A fault proxy in front of the test's emulator: ``endpoint`` for --custom-endpoint."""

    def __init__(self, emulator: Emulator, faults: Faults, *, rate_bytes_s: float = 1e12) -> None:
        port = int(emulator.endpoint.rsplit(":", 1)[1].strip("/"))
        self.faults = faults
        self.proxy = ShapingProxy(
            ("127.0.0.1", port), delay_s=0, rate_bytes_s=rate_bytes_s, faults=faults
        )

    def start(self) -> FaultProxy:
        self.proxy.start()
        return self

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    @property
    def option(self) -> str:
        return f"--custom-endpoint={self.endpoint}"

    def stop(self) -> None:
        self.proxy.stop()


@pytest.fixture
def fault_proxy(emulator: Emulator) -> Iterator[FaultProxy]:
    """A proxy with no rules yet (add them to ``.faults``); stopped after the test."""
    proxy = FaultProxy(emulator, Faults()).start()
    try:
        yield proxy
    finally:
        proxy.stop()
