"""The dashboard in a real headless Chromium against a real HTTP server with seeded data.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them where missing);
skipped without them. The screenshot is saved next to the test's files (and into
``DPGOV_SCREENSHOT_DIR`` when set).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from pydantic import SecretStr

from dp_governor.api.app import create_app
from dp_governor.api.server import free_port
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.mechanisms import HCMS
from dp_governor.policies import PolicyCreate, mechanism_for

webdriver = pytest.importorskip("selenium.webdriver")
WebDriverWait = pytest.importorskip("selenium.webdriver.support.wait").WebDriverWait

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them)",
)
TOKEN = "dashboard-admin-token-dashboard-admin"
DAYS = 4
REFUSED = [30, 80, 10, 50]  # emoji's daily-cap refusals on each of the four days


def _mechanism(client: httpx.Client, name: str) -> Any:
    policy = client.get(f"/v1/use-cases/{name}").json()
    fields = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
    return mechanism_for(PolicyCreate.model_validate(fields))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real uvicorn server on an ephemeral port, seeded over HTTP."""
    tmp = tmp_path_factory.mktemp("dashboard")
    settings = Settings(
        database_url=f"sqlite:///{tmp / 'dash.sqlite'}",
        secret_file=tmp / "secret",
        audit_key_file=tmp / "audit.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        max_body_bytes=16 << 20,
        max_batch_items=5000,
    )
    # Four days of reports, the last one today: the trend panels get several points.
    clock = FixedClock(datetime.now(UTC) - timedelta(days=DAYS - 1))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, clock=clock), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=admin, timeout=60) as c:
        mech = _mechanism(c, "safari-energy-domains")
        assert isinstance(mech, HCMS)
        emoji = _mechanism(c, "emoji")
        rng = np.random.default_rng(7)
        values = ["popular.example"] * 2500 + ["rare.example"] * 500 + ["x.example"] * 1000
        rng.shuffle(values)
        reports = mech.privatize(values, rng=rng).to_dicts()
        per_day = len(reports) // DAYS
        for day in range(DAYS):  # new devices each day, one report each
            items = [
                {"device_id": f"dev-{i}", "report": reports[i]}
                for i in range(day * per_day, (day + 1) * per_day)
            ]
            r = c.post("/v1/use-cases/safari-energy-domains/reports:batch", json={"items": items})
            assert r.status_code == 200 and r.json()["accepted"] == per_day, r.text
            # emoji allows one report a day: each of these devices' second one is refused
            twice = [f"emoji-{day}-{i}" for i in range(REFUSED[day]) for _ in range(2)]
            emoji_reports = emoji.privatize(["x"] * len(twice), rng=rng).to_dicts()
            items = [
                {"device_id": d, "report": e} for d, e in zip(twice, emoji_reports, strict=True)
            ]
            r = c.post("/v1/use-cases/emoji/reports:batch", json={"items": items})
            assert r.json()["accepted"] == REFUSED[day], r.text
            assert c.post("/v1/admin/jobs/aggregate:run").status_code == 200
            if day < DAYS - 1:
                clock.advance(days=1)
        assert c.post("/v1/admin/jobs/checkpoint:run").status_code == 200
        assert c.post("/v1/admin/jobs/verify:run").status_code == 200
    yield base
    server.should_exit = True
    thread.join(timeout=10)


def _browser() -> Any:
    """A headless Chromium driven by chromedriver, keeping the browser console's log."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,4400")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=str(DRIVER))
    return webdriver.Chrome(options=options, service=service)


def test_the_dashboard_renders_the_seeded_data_without_console_errors(
    server: str, tmp_path: Path
) -> None:
    driver = _browser()
    try:
        # Estimates on the dashboard are for admins, as on the estimates route.
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}}
        )
        query = "?estimate=safari-energy-domains&candidates=popular.example"
        query += "&candidates=rare.example&candidates=never.example"
        driver.get(server + "/" + query)
        assert driver.title == "dp-governor"
        page = driver.find_element("tag name", "body").text
        policies = driver.find_element("id", "policies").text
        assert "emoji" in policies and "safari-energy-domains" in policies
        head = policies.splitlines()[0]
        for cap in ("daily cap", "window cap", "lifetime cap", "budget group"):
            assert cap in head, head
        safari = next(line for line in policies.splitlines() if line.startswith("safari-energy"))
        assert "safari-domains" in safari  # its budget group
        # the trends: one dot per day of the last 14, a line per use case / per reason
        dots = driver.find_elements("css selector", "#accepted-trend svg circle")
        assert len(dots) == 2 * 14  # safari-energy-domains and emoji
        accepted = driver.find_element("id", "accepted-trend").text
        assert (
            "safari-energy-domains: 4,000" in accepted and f"emoji: {sum(REFUSED):,d}" in accepted
        )
        refused = driver.find_element("id", "refusals-trend")
        assert len(refused.find_elements("css selector", "svg polyline")) == 3  # the reasons
        assert f"daily_cap: {sum(REFUSED):,d}" in refused.text
        titles = [
            t.get_attribute("textContent")
            for t in refused.find_elements("css selector", "svg circle title")
        ]
        daily = [int(t.rsplit(": ", 1)[1]) for t in titles if t.startswith("daily_cap")]
        assert daily[-DAYS:] == REFUSED and daily[:-DAYS] == [0] * (14 - DAYS)
        by_use_case = driver.find_element("id", "refusals-by-use-case").text
        assert f"emoji/daily_cap {sum(REFUSED)} {REFUSED[-1]}" in by_use_case
        chain = driver.find_element("id", "chain").text
        assert "checked" in chain and "ago" in chain and "latest signed checkpoint" in chain
        report = driver.find_element("id", "effective-epsilon").text
        row = next(line for line in report.splitlines() if line.startswith("safari-energy"))
        assert row.endswith(" 4000")  # devices that spent in the window
        assert "8 / 8 / 8" not in row and "4 / 4 / 4" in row  # one report each, eps 4
        assert driver.find_element("id", "chain-status").text == "verified"
        charts = driver.find_elements("css selector", "#cumulative svg polyline")
        assert len(charts) == 4  # max and p99 for each of the two use cases with charges
        assert driver.find_elements("css selector", "#histograms svg rect")
        estimates = driver.find_element("id", "estimates").text
        assert "popular.example" in estimates
        assert "nothing bounds" not in page  # the page states it as a column: lifetime bounded
        severe = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert severe == [], severe
        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("DPGOV_SCREENSHOT_DIR"):
            target = Path(os.environ["DPGOV_SCREENSHOT_DIR"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, target / "dashboard.png")
    finally:
        driver.quit()


def test_unknown_estimate_use_case_is_a_404(server: str) -> None:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.get(server + "/?estimate=nope&candidates=x", headers=admin, timeout=60)
    assert r.status_code == 404


def _wait(driver: Any, until: Any) -> None:
    """Wait for the page a click loads (a form's POST, then its redirect)."""
    WebDriverWait(driver, 120).until(until)  # generous: never a speed assertion


def test_a_browser_signs_in_with_the_admin_token_to_see_the_estimates(server: str) -> None:
    """No header to set: asking for estimates shows a sign-in form, never a raw 401 JSON page."""
    driver = _browser()
    query = "/?estimate=safari-energy-domains&candidates=popular.example&candidates=rare.example"
    try:
        driver.get(server + query)
        assert driver.title == "dp-governor: sign in"
        assert "detail" not in driver.find_element("tag name", "body").text  # no JSON
        form = driver.find_element("id", "sign-in")
        form.find_element("id", "token").send_keys("not-the-token-not-the-token-not-the")
        form.find_element("css selector", "button[type=submit]").click()
        _wait(driver, lambda d: d.find_elements("id", "problem"))
        assert driver.find_element("id", "problem").text == "the admin token is not valid"
        form = driver.find_element("id", "sign-in")
        form.find_element("id", "token").send_keys(TOKEN)
        form.find_element("css selector", "button[type=submit]").click()
        _wait(driver, lambda d: d.title == "dp-governor")
        # back on the page it asked for, with its estimates
        assert driver.title == "dp-governor"
        assert driver.current_url == server + query
        estimates = driver.find_element("id", "estimates").text
        assert "safari-energy-domains: estimates" in estimates and "popular.example" in estimates
        cookie = driver.get_cookie("dpgov_dashboard")
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        driver.get(server + "/")  # signed in, the plain page shows estimates too, and sign-out
        driver.find_element("css selector", "#account button[type=submit]").click()
        _wait(driver, lambda d: d.find_elements("css selector", "p#account"))
        assert driver.get_cookie("dpgov_dashboard") is None
        assert driver.find_element("id", "account").text.startswith("Sign in with the admin")
        driver.get(server + query)
        assert driver.title == "dp-governor: sign in"  # signed out: the form again
        severe = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        # the two refusals (403 bad token, 401 signed out) are the only console lines
        assert all("40" in e["message"] for e in severe), severe
    finally:
        driver.quit()


def test_the_sign_in_form_refuses_another_sites_post_and_redirects_only_here(server: str) -> None:
    form = {"token": TOKEN, "next": "//evil.example/"}
    answer = httpx.post(server + "/sign-in", data=form, timeout=60)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    assert "dpgov_dashboard=" in answer.headers["set-cookie"]
    assert "httponly" in answer.headers["set-cookie"].lower()
    foreign = {"Origin": "https://evil.example"}
    answer = httpx.post(server + "/sign-in", data=form, headers=foreign, timeout=60)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    # an API client without the header still gets the JSON 401 naming it
    answer = httpx.get(server + "/?estimate=emoji&candidates=x", timeout=60)
    assert answer.status_code == 401 and "Authorization" in answer.json()["detail"]
    # the cookie opens the dashboard only, never the API's admin routes
    signed = httpx.post(server + "/sign-in", data={"token": TOKEN}, timeout=60)
    session = {"dpgov_dashboard": signed.cookies["dpgov_dashboard"]}
    api = httpx.post(server + "/v1/admin/jobs/checkpoint:run", cookies=session, timeout=60)
    assert api.status_code == 401
    page = httpx.get(server + "/?estimate=emoji&candidates=x", cookies=session, timeout=60)
    assert page.status_code == 200 and 'id="estimates"' in page.text
