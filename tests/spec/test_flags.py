"""Every numeric flag of every command is checked before anything is asked, started or
served, and a host or slice listed twice is a spec error naming both places: exit 2, one
sentence per problem, no traceback. Through the real CLI."""

from __future__ import annotations

import pytest

from harness.helpers import launch
from test_inputs import _refused


@pytest.mark.parametrize("value", ["-5", "nan", "0", "inf"])
@pytest.mark.parametrize("command", ["stacks", "profile"])
def test_a_wait_that_is_not_seconds_above_zero_is_refused_before_anything_is_asked(tmp_path, command,
                                                                                   value):
    """The directory holds no run at all: the flag is what is refused, before the run is looked at."""
    said = "inf" if value == "inf" else "nan" if value == "nan" else value
    _refused(launch(command, str(tmp_path), "--timeout-s", value),
             f"error: --timeout-s: expected a number of seconds > 0, got {said}: how long to wait for")


@pytest.mark.parametrize("args, needle", [
    (("--port", "-1"), "--port: expected a port from 1 to 65535 (0: a free one), got -1"),
    (("--port", "70000"), "--port: expected a port from 1 to 65535 (0: a free one), got 70000"),
    (("--startup-timeout-s", "nan"), "--startup-timeout-s: expected a number of seconds > 0, got nan"),
    (("--startup-timeout-s", "0"), "--startup-timeout-s: expected a number of seconds > 0, got 0"),
])
def test_launch_tensorboard_refuses_a_bad_port_or_wait_before_serving(tmp_path, args, needle):
    _refused(launch("tensorboard", str(tmp_path), *args), needle)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_the_main_commands_status_period_is_checked(value):
    _refused(launch("jobs/linear.yaml", "--dry-run", "--status-every", value),
             "--status-every: expected a number of seconds >= 0 (0 = never), got")


def test_a_host_listed_twice_is_a_spec_error_naming_both_places(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("backend: ssh\nhosts:\n  - h1\n  - h2\n  - {host: h1}\n")
    _refused(launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run"),
             f"{cluster}:5: cluster.hosts[2]: 'h1' is listed twice (cluster.hosts[0] and "
             "cluster.hosts[2]); list each host once")


def test_a_slice_listed_twice_is_a_spec_error_naming_both_places(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("backend: tpu\nzone: us-central2-b\naccelerator_type: v4-32\n"
                       "slices: [a, b, a]\n")
    _refused(launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run"),
             "cluster.slices[2]: 'a' is listed twice (cluster.slices[0] and cluster.slices[2])")
