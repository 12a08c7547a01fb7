"""Over real HTTP, on SQLite and PostgreSQL: edit sequences that once loosened caps silently.

Each test reproduces one finding of an adversarial operator against a real uvicorn server whose
clock the test sets (days pass without waiting), and checks the rule: spend charged under a
budget keeps counting there and in its use case's budget now; a budget's name is never taken
by another; a group's shared terms change together; a loosening needs ``allow_loosen``; every
figure the service states holds against what devices spent, and is never stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.server import free_port
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.conftest import BACKENDS, PG_URL

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

TOKEN = "caps-admin-token-caps-admin-token-caps-admin"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
START = datetime(2026, 6, 1, 12, tzinfo=UTC)
SAFARI = ("safari-energy-domains", "safari-crash-domains")


class Live:
    """A running server, its clock and its database, with the calls the tests make."""

    def __init__(self, base: str, clock: FixedClock, url: str, folder: Path) -> None:
        self.http = httpx.Client(base_url=base, timeout=300)
        self.clock = clock
        self.url = url
        self.folder = folder

    def policy(self, use_case: str) -> dict[str, Any]:
        found = self.http.get(f"/v1/use-cases/{use_case}")
        assert found.status_code == 200, found.text
        body: dict[str, Any] = found.json()
        return {k: body[k] for k in PolicyCreate.model_fields if k in body}

    def put(self, use_case: str, *, loosen: bool = False, **changes: Any) -> httpx.Response:
        """The use case's policy with ``changes``, as a new version."""
        return self.write({**self.policy(use_case), **changes}, loosen=loosen)

    def create(self, name: str, *, like: str = "emoji", **changes: Any) -> httpx.Response:
        """A new use case: ``like``'s policy under another name, with ``changes``."""
        return self.write({**self.policy(like), "name": name, **changes})

    def write(self, body: dict[str, Any], *, loosen: bool = False) -> httpx.Response:
        params = {"allow_loosen": "true"} if loosen else {}
        return self.http.put(
            f"/v1/use-cases/{body['name']}", json=body, params=params, headers=ADMIN
        )

    def group(self, group: str, *, loosen: bool = False, **changes: Any) -> httpx.Response:
        terms = self.http.get(f"/v1/budget-groups/{group}").json()["terms"]
        params = {"allow_loosen": "true"} if loosen else {}
        return self.http.put(
            f"/v1/budget-groups/{group}",
            json={**terms, **changes},
            params=params,
            headers=ADMIN,
        )

    def submit(self, device: str, use_case: str) -> int:
        fields = self.policy(use_case)
        body = mechanism_for(PolicyCreate.model_validate(fields)).privatize_one("x").to_dict()
        return self.http.post(
            f"/v1/use-cases/{use_case}/reports", json=body, headers={"X-Device-Id": device}
        ).status_code

    def status(self, device: str, use_case: str) -> dict[str, Any]:
        found = self.http.get(f"/v1/devices/{device}/budget", headers=ADMIN).json()
        line: dict[str, Any] = next(u for u in found["use_cases"] if u["use_case"] == use_case)
        return line

    def report(self) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get("/v1/audit/effective-epsilon").json()
        return found

    def line(self, use_case: str) -> dict[str, Any]:
        line: dict[str, Any] = next(
            x for x in self.report()["use_cases"] if x["use_case"] == use_case
        )
        return line

    def job(self, name: str) -> None:
        found = self.http.post(f"/v1/admin/jobs/{name}:run", headers=ADMIN)
        assert found.status_code == 200, found.text

    def days(self, n: int) -> None:
        self.clock.advance(days=n)

    def cli(self, *args: str) -> Result:
        """The real command line, in-process, on this server's database and keys."""
        env = {
            "DPGOV_DATABASE_URL": self.url,
            "DPGOV_SECRET_FILE": str(self.folder / "secret"),
            "DPGOV_AUDIT_KEY_FILE": str(self.folder / "audit.key"),
        }
        return CliRunner().invoke(cli, list(args), env=env)

    def apply(self, policies: list[dict[str, Any]], *args: str) -> Result:
        """``dpgov policies apply`` of a file holding ``policies``."""
        path = self.folder / "policies.yaml"
        complete = [{"hash_seed": None, **p} for p in policies]  # the API publishes no seed
        path.write_text(yaml.safe_dump({"policies": complete}), encoding="utf-8")
        return self.cli("policies", "apply", *args, str(path))


@pytest.fixture(params=BACKENDS)
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    """A real uvicorn server with a settable clock, on a new SQLite file or PostgreSQL schema."""
    database: AbstractContextManager[str] = nullcontext(f"sqlite:///{tmp_path / 'caps.sqlite'}")
    if request.param == "postgresql":
        assert PG_URL is not None
        database = scratch_schema(PG_URL, "caps")
    with database as url:
        settings = Settings(
            database_url=url,
            secret_file=tmp_path / "secret",
            audit_key_file=tmp_path / "audit.key",
            admin_token=SecretStr(TOKEN),
            scheduler=False,
            report_cache_seconds=3600,  # a cached report must still follow every policy edit
            flush_min_batch=1,
        )
        clock = FixedClock(START)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings, clock=clock),
                host="127.0.0.1",
                port=(port := free_port()),
                log_level="warning",
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 300
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started, "the server did not start"
        found = Live(f"http://127.0.0.1:{port}", clock, url, tmp_path)
        try:
            yield found
        finally:
            found.http.close()
            server.should_exit = True
            thread.join(timeout=60)


def test_leaving_a_group_and_rejoining_frees_nothing(live: Live) -> None:
    """Item 1: energy x2, energy leaves, crash x2, energy rejoins: the group still holds 2."""
    energy, crash = SAFARI
    assert [live.submit("dev", energy) for _ in range(3)] == [202, 202, 429]
    refused = live.put(energy, budget_group=None)
    assert refused.status_code == 409 and refused.json()["field"] == "allow_loosen"
    assert "no longer count safari-crash-domains's spend" in refused.json()["detail"]
    assert live.put(energy, budget_group=None, loosen=True).status_code == 200
    assert live.submit("dev", crash) == 429  # the group still holds energy's two reports
    assert live.submit("dev", energy) == 429  # energy's own budget counts its history
    assert live.put(energy, budget_group="safari-domains").status_code == 200  # rejoin: tighter
    assert live.submit("dev", crash) == 429 and live.submit("dev", energy) == 429
    assert live.status("dev", crash)["reports_today"] == 2  # never 4 against a cap of 2


def test_a_group_lifetime_cap_holds_across_leaving_and_rejoining(live: Live) -> None:
    """Item 1: with a lifetime cap of 8, leaving needs allow_loosen; what the report states holds.

    Leaving gives energy a budget of its own (its own cap of 8, counting all its history);
    the group keeps counting what energy spent under it. So the device's spend is at most
    the group's 8 plus energy's own 8, and the report's lifetime bound is at least what each
    budget counts.
    """
    energy, crash = SAFARI
    assert live.group("safari-domains", lifetime_epsilon_cap=8.0).status_code == 200
    accepted = 0
    for day in range(6):
        for use_case in (energy, crash):
            accepted += live.submit("dev", use_case) == 202
        move = None if day % 2 == 0 else "safari-domains"
        assert live.put(energy, budget_group=move).status_code == (409 if move is None else 200)
        assert live.put(energy, budget_group=move, loosen=True).status_code == 200
        live.days(1)
    assert accepted * 4 <= 8 + 8
    for use_case in SAFARI:
        line = live.line(use_case)
        spent = live.status("dev", use_case)["epsilon_lifetime"]
        assert line["lifetime_bounded"] and line["lifetime_bound"] >= spent
        assert f"bounds the loss at {line['lifetime_bound']:g}" in line["lifetime_note"]


def test_moving_back_and_forth_between_groups_sends_no_more_than_one_configuration(
    live: Live,
) -> None:
    """Item 1: G -> H -> G -> H within a day allows what one configuration allows, no more."""
    for name, group in (("one", "gee"), ("two", "gee"), ("three", "aitch"), ("four", "aitch")):
        made = live.create(name, budget_group=group, max_reports_per_day=2)
        assert made.status_code == 200, made.text
    sent = 0
    for group in ("aitch", "gee", "aitch", "gee"):
        sent += sum(live.submit("dev", "one") == 202 for _ in range(3))
        assert live.put("one", budget_group=group, loosen=True).status_code == 200
    assert sent == 2  # every configuration counts the reports "one" already sent today
    assert live.submit("dev", "two") == 429  # gee holds one's reports, charged under it


def test_retiring_a_member_and_recreating_it_outside_frees_nothing(live: Live) -> None:
    """Item 1: a member retired and re-created outside the group takes nothing back."""
    energy, crash = SAFARI
    assert live.submit("dev", energy) == 202 and live.submit("dev", energy) == 202
    body = live.policy(energy)
    assert live.http.delete(f"/v1/use-cases/{energy}", headers=ADMIN).status_code == 200
    assert live.submit("dev", crash) == 429
    outside = {**body, "budget_group": None}
    refused = live.write(outside)  # the group would stop counting energy: it loosens
    assert refused.status_code == 409 and refused.json()["field"] == "allow_loosen"
    assert live.write(outside, loosen=True).status_code == 200
    assert live.submit("dev", energy) == 429 and live.submit("dev", crash) == 429


def test_a_groups_shared_terms_change_together(live: Live) -> None:
    """Item 2: tightened over HTTP and in a policy file, both members at once."""
    energy, crash = SAFARI
    alone = live.put(energy, max_reports_per_day=1)
    assert alone.status_code == 409 and alone.json()["field"] == "max_reports_per_day"
    assert live.group("safari-domains", max_reports_per_day=1).status_code == 200
    assert live.policy(energy)["max_reports_per_day"] == live.policy(crash)["max_reports_per_day"]
    assert live.submit("dev", energy) == 202 and live.submit("dev", crash) == 429
    both = [{**live.policy(n), "lifetime_epsilon_cap": 40.0} for n in SAFARI]
    applied = live.apply(both)
    assert applied.exit_code == 0, applied.output
    assert {live.policy(n)["lifetime_epsilon_cap"] for n in SAFARI} == {40.0}
    raised = [{**live.policy(n), "max_reports_per_day": 2} for n in SAFARI]
    refused = live.apply(raised)
    assert refused.exit_code == 1 and "--allow-loosen" in refused.output
    assert live.apply(raised, "--allow-loosen").exit_code == 0


def test_no_use_case_takes_a_budgets_name(live: Live) -> None:
    """Item 3: a use case named like a group, or a group named like a use case: refused."""
    before = live.report()["totals"]["allowed_per_day"]["epsilon_basic"]
    named = live.create("safari-domains")
    assert named.status_code == 409 and named.json()["field"] == "name"
    joined = live.put("lookup-hints", budget_group="emoji", loosen=True)
    assert joined.status_code == 409 and joined.json()["field"] == "budget_group"
    assert live.report()["totals"]["allowed_per_day"]["epsilon_basic"] == before


def test_a_purge_keeps_what_a_longer_window_of_the_group_counts(live: Live) -> None:
    """Item 4: a retired member with a shorter retention loses no day the group's window needs."""
    energy, crash = SAFARI
    assert (
        live.group("safari-domains", retention_days=30, window_epsilon_cap=8.0).status_code == 200
    )
    assert live.submit("dev", energy) == 202 and live.submit("dev", energy) == 202
    assert live.http.delete(f"/v1/use-cases/{energy}", headers=ADMIN).status_code == 200
    assert live.group("safari-domains", retention_days=90).status_code == 200
    live.days(40)
    live.job("purge")
    assert live.status("dev", crash)["epsilon_window"] == 8.0  # energy's 8, 40 days ago
    assert live.submit("dev", crash) == 429


def test_the_device_audit_counts_reports_charged_before_the_window(live: Live) -> None:
    """Item 5: reports charged before the window and published in it count in its figure."""
    assert live.create("held", retention_days=10, min_batch_devices=2).status_code == 200
    for device in ("d1", "d2"):
        assert live.submit(device, "held") == 202
    live.days(20)
    flushed = live.http.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN)
    assert flushed.status_code == 200, flushed.text
    assert flushed.json()["result"]["moved"] == 2
    audit = live.http.get("/v1/audit/devices/d1", headers=ADMIN).json()
    (mine,) = audit["central"]
    assert mine["window"] is not None and mine["window"]["reports_per_device"] == 1


def test_a_tightened_lifetime_cap_never_states_less_than_was_spent(live: Live) -> None:
    """Item 6: lifetime cap 100 -> 20 after 40 spent: the report bounds the loss at 40."""
    assert live.put("emoji", lifetime_epsilon_cap=100.0).status_code == 200
    for _ in range(10):
        assert live.submit("dev", "emoji") == 202
        live.days(1)
    assert live.put("emoji", lifetime_epsilon_cap=20.0).status_code == 200
    line = live.line("emoji")
    assert line["lifetime_bounded"] and line["lifetime_bound"] == 40.0
    assert "bounds the loss at 40" in line["lifetime_note"]
    assert line["devices_over_lifetime_cap"] == 1
    assert live.submit("dev", "emoji") == 429


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"budget_group": None}, "no longer count"),
        ({"group_size": 1}, "`group_size` lowered from 3 to 1"),
        ({"min_batch_devices": 1}, "`min_batch_devices` lowered from 10 to 1"),
        ({"delta": 1e-6}, "`delta` raised from 1e-09 to 1e-06"),
    ],
)
def test_apply_asks_for_allow_loosen_for_every_loosening(
    live: Live, change: dict[str, Any], named: str
) -> None:
    """Item 7: leaving a group, a smaller group or batch, a larger delta: each loosens."""
    energy, crash = SAFARI
    tighter = [{**live.policy(n), "group_size": 3, "min_batch_devices": 10} for n in SAFARI]
    assert live.apply(tighter).exit_code == 0
    proposed = [{**live.policy(energy), **change}, live.policy(crash)]
    refused = live.apply(proposed)
    assert refused.exit_code == 1 and named in refused.output, refused.output
    assert live.apply(proposed, "--allow-loosen").exit_code == 0


def test_the_report_follows_a_policy_edit_at_once(live: Live) -> None:
    """Item 8: a cached report never outlives the policy book it was computed from."""
    energy = SAFARI[0]
    first = live.report()
    assert first["computed_at"].startswith(START.date().isoformat())
    line = next(x for x in first["use_cases"] if x["use_case"] == energy)
    assert line["epsilon_per_report"] == 4.0
    assert live.put(energy, epsilon_per_report=8.0, loosen=True).status_code == 200
    after = next(x for x in live.report()["use_cases"] if x["use_case"] == energy)
    assert after["epsilon_per_report"] == 8.0
    page = live.http.get("/")
    assert page.status_code == 200 and "computed at" in page.text


def test_raising_retention_past_a_purge_counts_what_it_cannot_date(live: Live) -> None:
    """Item 9: the new 90-day window holds 120; status says so (an upper bound), not 40."""
    assert live.create("brief", retention_days=10).status_code == 200
    for _ in range(30):
        assert live.submit("dev", "brief") == 202
        live.days(1)
    live.days(-1)
    live.job("purge")
    assert live.status("dev", "brief")["epsilon_window"] == 40.0
    assert live.put("brief", retention_days=90).status_code == 200
    assert live.status("dev", "brief")["epsilon_window"] == 120.0


def test_printed_bounds_round_up_and_group_figures_say_they_are_bounds(live: Live) -> None:
    """Item 10: no printed bound below its value; group-scaled figures are upper bounds."""
    assert live.put("emoji", group_size=2).status_code == 200
    assert live.submit("dev", "emoji") == 202
    totals = live.report()["totals"]
    assert totals["allowed_per_day"]["bound"] != "exact optimal"
    assert totals["device_bound_lifetime"]["bounds"].get("exact optimal", 0) == 0
    text = live.cli("audit", "report")
    assert text.exit_code == 0, text.output
    assert "computed at" in text.output
