"""`/dashboard` in a real browser: headless Chromium from Debian's `chromium` package, driven by
Selenium through Debian's `chromium-driver` (nothing downloaded), against a real stack with tiny
models and an API key.

`MTPSTACK_DOCS_SCREENSHOTS=1` writes the screenshots into `docs/` (how the ones there were made).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
from aiohttp import web

from mtpstack.proxy.app import create_app
from tests.e2e.conftest import fleet, get_text, metric, running_stack, wait_until
from mtpstack.validator import FleetConfig

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
KEY = "sk-dashboard-test-key"
DOCS = Path(__file__).resolve().parents[2] / "docs"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's `chromium` and `chromium-driver` on PATH (`.ci/run` installs them: apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1800"):
        options.add_argument(arg)
    # Without the OpenBLAS the workers are preloaded with: in Chromium's renderer it crashes the tab.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER, env=env), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def keyed_stack(tiny_pair, tmp_path_factory):
    """One worker of width 2 behind a proxy that wants an API key."""
    root = tmp_path_factory.mktemp("dash-stack")
    (root / "keys").write_text(KEY + "\n")
    config = fleet(*tiny_pair, width=2)
    config["proxy"]["apiKeysFile"] = str(root / "keys")
    with running_stack(root, config) as s:
        yield s


def text_of(driver, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", css).text
    except (NoSuchElementException, StaleElementReferenceException):  # the page re-renders every second
        return ""


def page_shows(driver, css: str, want, what: str, timeout: float = 10.0) -> str:
    """Wait (bounded) until the element's text satisfies `want` (a string it must equal, or a predicate)."""
    ok = want if callable(want) else (lambda t: t == want)
    return wait_until(lambda: (t := text_of(driver, css)) and ok(t) and t, timeout, what)


def unlock(driver, url: str) -> None:
    driver.get(url + "/dashboard")
    wait_until(lambda: driver.find_element("id", "key-form").is_displayed(), 10, "the key prompt")
    driver.find_element("id", "key-input").send_keys(KEY)
    driver.find_element("id", "key-submit").click()
    page_shows(driver, "[data-worker] [data-field=health]", lambda t: t in ("healthy", "UNHEALTHY"), "the first render")


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    out = (DOCS if os.environ.get("MTPSTACK_DOCS_SCREENSHOTS") == "1" else tmp_path) / name
    # The whole page, not one window's worth.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, max(height + 120, 600))
    driver.save_screenshot(str(out))
    return out


def test_the_key_prompt_refuses_a_wrong_key_and_accepts_the_right_one(browser, keyed_stack):
    browser.get(keyed_stack.proxy_url + "/dashboard")
    wait_until(lambda: browser.find_element("id", "key-form").is_displayed(), 10, "the key prompt")
    page_shows(browser, "[data-field=fleet-status]", "API key needed", "the banner to ask for the key")
    browser.find_element("id", "key-input").send_keys("sk-wrong")
    browser.find_element("id", "key-submit").click()
    page_shows(browser, "#key-error", "that key was refused", "the wrong key to be refused")
    browser.find_element("id", "key-input").send_keys(KEY)
    browser.find_element("id", "key-submit").click()
    page_shows(browser, "[data-worker=w0] [data-field=health]", "healthy", "the worker to show")
    assert not browser.find_element("id", "key-form").is_displayed()
    assert KEY not in browser.current_url
    # The key is in page memory only: no storage holds it.
    assert browser.execute_script("return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie") == "{}{}"


def test_the_page_shows_the_figures_metrics_shows(browser, keyed_stack, tmp_path):
    import openai

    unlock(browser, keyed_stack.proxy_url)
    c = openai.OpenAI(base_url=keyed_stack.proxy_url + "/v1", api_key=KEY, max_retries=0)
    for _ in c.completions.create(model="tiny", prompt="def fib(n):", max_tokens=24, temperature=0, stream=True):
        pass
    worker = get_text(keyed_stack.worker_url("w0") + "/metrics")
    for position in (1, 2, 3):
        accepted = metric(worker, "mtpstack_worker_accepted_by_position_total", position=str(position))
        drafted = metric(worker, "mtpstack_worker_drafted_by_position_total", position=str(position))
        page_shows(
            browser, f"[data-worker=w0] [data-position='{position}']",
            lambda t, a=accepted, d=drafted: t.startswith(f"position {position}: {a:g} accepted of {d:g} drafted"),
            f"position {position} to show the worker's counts",
        )
    depth = metric(worker, "mtpstack_worker_draft_depth")
    page_shows(browser, "[data-worker=w0] [data-field=live-depth]", lambda t, d=depth: t.startswith(f"{d:g}"),
               "the last step's draft depth as /metrics has it")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_stack.proxy_url + "/v1", api_key="sk-wrong", max_retries=0).completions.create(
            model="tiny", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    proxy = get_text(keyed_stack.proxy_url + "/metrics")
    for code in ("invalid_api_key", "model_not_found"):
        n = metric(proxy, "mtpstack_proxy_refusals_total", code=code, model="-")
        page_shows(browser, f"[data-field=refusals-without-model] [data-refusal={code}]", lambda t, n=n: t.endswith(f"{code}: {n:g}"),
                   f"the page's {code} count to be /metrics'")
    gate = metric(proxy, "mtpstack_proxy_gate", worker="w0")
    page_shows(browser, "[data-worker=w0] [data-field=inflight]", f"0 / {gate:g}", "in flight and gate as /metrics has them")
    page_shows(browser, "[data-worker=w0] [data-field=ttft]", lambda t: " ms (" in t and "n=" in t, "first token as a median with spread")
    page_shows(browser, "[data-coupling=w0] [data-field=coupling-status]", "agrees", "the coupling to agree")
    routed = {d: metric(proxy, "mtpstack_proxy_routing_total", model="tiny", decision=d) for d in ("affinity", "fallback_busy", "new")}
    page_shows(browser, "[data-model=tiny] [data-field=routing]",
               lambda t: t.startswith("affinity hits") and t.endswith(f"{routed['fallback_busy']:g} moved as it was full, {routed['new']:g} new)"),
               "the routing decisions /metrics counts")
    # The worker's prefix-cache hit rate beside it: a dash while the worker exports no prefix-cache series.
    lookups = metric(worker, "mtpstack_worker_prefix_cache_lookups_total")
    page_shows(browser, "[data-worker=w0] [data-field=prefix-cache]", lambda t: (t == "–") == (lookups is None), "the prefix cache")
    page_shows(browser, "[data-model=tiny] [data-prefix-cache=w0]", lambda t: t.startswith("w0: ") and (t == "w0: –") == (lookups is None),
               "the worker's prefix-cache hit rate beside the model's routing")
    # Its disk tier's share of the lookups (`mtpstack up` gives every native worker one in its run directory).
    disk = metric(worker, "mtpstack_worker_prefix_cache_disk_bytes")
    page_shows(browser, "[data-worker=w0] [data-field=prefix-cache]", lambda t: ("from disk" in t) == (disk is not None),
               "the disk tier's hit rate")
    # Usage per tenant (a key alone is tenant `default`), the worker's own counts of the stream, as /metrics has them.
    for field, name in (("prompt-tokens", "prompt_tokens"), ("cached-tokens", "cached_tokens"), ("completion-tokens", "completion_tokens")):
        n = metric(get_text(keyed_stack.proxy_url + "/metrics"), f"mtpstack_proxy_tenant_{name}_total", tenant="default")
        assert n is not None and (n > 0 or field == "cached-tokens")
        page_shows(browser, f"[data-tenant=default] [data-field={field}]", f"{n:g}", f"the tenant's {name} as /metrics counts them")
    assert screenshot(browser, "dashboard.png", tmp_path).stat().st_size > 10_000


def test_at_phone_width_nothing_spills_sideways(browser, keyed_stack, tmp_path):
    unlock(browser, keyed_stack.proxy_url)
    browser.set_window_size(390, 1600)
    try:
        page_shows(browser, "[data-worker=w0] [data-field=health]", "healthy", "the page at phone width")
        overflow = browser.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0
        assert screenshot(browser, "dashboard-phone.png", tmp_path).stat().st_size > 10_000
    finally:
        browser.set_window_size(1280, 1800)


def test_a_killed_worker_turns_unhealthy_on_the_page_and_back_after_its_restart(browser, keyed_stack):
    unlock(browser, keyed_stack.proxy_url)
    pid = keyed_stack.worker_pid("w0")
    restarts = int(text_of(browser, "[data-worker=w0] [data-field=restarts]"))
    os.kill(pid, signal.SIGKILL)
    # Health checks run every second and the page polls every second: a few seconds at most.
    page_shows(browser, "[data-worker=w0] [data-field=health]", "UNHEALTHY", "the page to show the worker unhealthy", timeout=10)
    page_shows(browser, "[data-field=fleet-status]", lambda t: "PROBLEM" in t, "the banner to name a problem")
    page_shows(browser, "[data-worker=w0] [data-field=health]", "healthy", "the restarted worker to be healthy", timeout=90)
    page_shows(browser, "[data-worker=w0] [data-field=restarts]", str(restarts + 1), "the restart to be counted")
    page_shows(browser, "[data-worker=w0] [data-field=pid]", lambda t: t != str(pid), "the new pid")


class ThreadedProxy:
    """The proxy app served from its own thread and event loop, so a blocking browser driver can look at it."""

    def __init__(self, app: web.Application, port: int):
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(port), self.loop).result(timeout=30)

    async def _start(self, port: int) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def test_a_width_that_differs_from_the_gate_is_flagged_on_the_page(browser, width_1_worker, tmp_path):
    # The worker runs `--max-num-seqs 1`; this proxy's gate (and the config's width) is 2.
    data = width_1_worker
    data = {**data, "proxy": {**data["proxy"], "modelConcurrencyLimits": {"tiny": 2}},
            "workers": {"w0": {**data["workers"]["w0"], "maxNumSeqs": 2}}}
    proxy = ThreadedProxy(create_app(FleetConfig.model_validate(data), health_interval=0.2, fleet_interval=0.2), data["proxy"]["port"])
    try:
        browser.get(proxy.url + "/dashboard")
        page_shows(browser, "[data-coupling=w0] [data-field=coupling-status]", "DIFFERS", "the coupling flag")
        assert text_of(browser, "[data-coupling=w0] [data-field=gate]") == "2"
        assert text_of(browser, "[data-coupling=w0] [data-field=width]") == "1"
        page_shows(browser, "[data-worker=w0] [data-field=weights-status]", "DIFFER FROM THE CONFIG", "the weights flag")
        assert screenshot(browser, "dashboard-coupling.png", tmp_path).stat().st_size > 10_000
    finally:
        proxy.close()
