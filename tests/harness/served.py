"""``launch tensorboard RUN`` as a user opens it: the profile plugin's answers over HTTP, and
its page rendered by headless Chromium (tests/commands/test_profile.py, the ssh profile test)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

from harness import sshenv
from harness.helpers import LAUNCH, REPO, Output, env_for_tests
from launcher.commands import tensorboard as tensorboard_command


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        assert not sshenv.in_ci(), "chromium is missing (bash .ci/run installs it)"
        pytest.skip(sshenv.UNAVAILABLE + "headless chromium (apt-get install chromium)")
    return found


def served(run_dir) -> tuple:
    """``launch tensorboard RUN``, started: (the process, its URL)."""
    proc = subprocess.Popen(LAUNCH + ["tensorboard", str(run_dir)], cwd=REPO, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            stdin=subprocess.DEVNULL)
    line = Output.of(proc).wait_for(r"^podlaunch: TensorBoard of ", 120)
    return proc, re.search(r"at (http://localhost:\d+/)#custom_scalars ", line).group(1)


def get(url: str):
    with urllib.request.urlopen(url, timeout=60) as reply:
        body = reply.read()
    return json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)  # the plugin gzips


def rendered(page_url: str, screenshot: str | None = None) -> str:
    """The text of ``page_url`` as headless Chromium renders it (scripts run, styles and
    scripts dropped); with ``screenshot``, a PNG of it there too."""
    # one Chromium run does both (two runs cost twice its start and the page's scripts)
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
               "--virtual-time-budget=20000", "--dump-dom"]
    if screenshot is not None:
        command.append(f"--screenshot={screenshot}")
    page = subprocess.run(command + [page_url], capture_output=True, text=True,
                          timeout=120).stdout
    return re.sub(r"\s+", " ", re.sub(r"<[^>]*>", " ", re.sub(
        r"<(style|script)\b.*?</\1>", "", page, flags=re.S)))


def check_served(run_dir, session: str, process_ids: list, first_step: int) -> None:
    """The profile plugin lists the session and one host per process and serves each process's
    trace viewer data holding its traced steps (their annotations, the all-reduce); Chromium
    renders the plugin's overview page and each process's trace viewer (screenshots beside
    the run: ``profile-overview.png``, ``profile-trace-process_N.png``; looked at once, by a
    person: the overview's step time, and each timeline's steps and psum ops)."""
    proc, url = served(run_dir)
    try:
        note = Output.of(proc).wait_for(r"^podlaunch: .*profile session", 30)
        assert "Profile tab" in note, note
        base = url + "data/plugin/profile/"
        runs = get(base + "runs")
        (run,) = [r for r in runs if r.endswith("/" + session)]
        assert run.endswith(f" {tensorboard_command.PROFILES_SUFFIX}/{session}")
        tools = get(base + "run_tools?" + urllib.parse.urlencode({"run": run}))
        assert {"overview_page", "trace_viewer@"} <= set(tools), tools
        hosts = get(base + "hosts?" + urllib.parse.urlencode({"run": run, "tag": "trace_viewer"}))
        assert sorted(h["hostname"] for h in hosts) == [f"process_{p}" for p in process_ids]
        for p in process_ids:
            events = get(base + "data?" + urllib.parse.urlencode(
                {"run": run, "tag": "trace_viewer", "host": f"process_{p}"}))["traceEvents"]
            names = {e.get("name", "") for e in events}
            assert f"train {first_step}" in names, sorted(names)[:40]  # the step's annotation
            assert any(n.startswith(("psum", "all-reduce")) for n in names), sorted(names)[:40]
        # the plugin's own page: it opens on the newest session; its overview found the steps
        text = rendered(base + "index.html", os.path.join(str(run_dir), "profile-overview.png"))
        assert f"Sessions ({len(runs)})" in text and any(r in text for r in runs), text[:2000]
        assert "Overview Page" in text and "Average Step Time" in text, text[:2000]
        for p in process_ids:  # each process's timeline, as its host selector opens it
            data = "/data/plugin/profile/data?" + urllib.parse.urlencode(
                {"run": run, "tool": "trace_viewer", "host": f"process_{p}", "tag": "trace_viewer@",
                 "hosts": f"process_{p}"})
            shot = os.path.join(str(run_dir), f"profile-trace-process_{p}.png")
            text = rendered(base + "trace_viewer_index.html?" + urllib.parse.urlencode(
                {"is_streaming": "true", "is_oss": "true", "trace_data_url": data,
                 "source_code_service": "false"}), shot)
            assert f"process_{p} /host:CPU" in text, text[:2000]  # its track, drawn
            assert os.path.getsize(shot) > 20000  # a drawn timeline, not a blank page
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
