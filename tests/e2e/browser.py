"""
A real headless Chromium for the end-to-end suite: Debian's C{chromium}, driven through
Debian's C{chromium-driver} with selenium (never a downloaded browser or driver).

  - L{start_chromium}: one browser for a test, quit (and its driver process gone) at
    the test's cleanup, after its last page, URL and console log are written to the
    test's temp directory (for a look after a failure);
  - every L{Chromium} method runs the blocking WebDriver call in a thread
    (C{deferToThread}), so the reactor keeps serving the test's in-process backends
    while the browser waits on them;
  - L{Chromium.until} polls a condition in the page with a deadline: tests never sleep
    a fixed time to let the browser catch up.

A missing browser or driver fails the test with what to install: `make test` installs
them (Debian's chromium and chromium-driver).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

reactor: Any = _reactor

__all__ = ["CHROMEDRIVER", "CHROMIUM", "Chromium", "log_in_at_provider", "start_chromium"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SETUP_HINT = "run `make test` as root (it installs Debian's chromium and chromium-driver)"

_T = TypeVar("_T")


class Chromium:
    """
    One headless Chromium (one window; more with L{new_tab}).
    """

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def call(self, function: Callable[..., _T], *args: Any) -> _T:
        """
        Run C{function(*args)} (a blocking WebDriver call) in a thread.
        """
        result: _T = await deferToThread(function, *args)
        return result

    async def go(self, url: str) -> None:
        """
        Navigate the current tab to C{url} (returns once the page has loaded).
        """
        await self.call(self.driver.get, url)

    async def url(self) -> str:
        """
        The current tab's URL.
        """
        current: str = await self.call(lambda: self.driver.current_url)
        return current

    async def js(self, script: str, *args: Any) -> Any:
        """
        Run C{script} (a function body: C{return ...}) in the page.
        """
        return await self.call(self.driver.execute_script, script, *args)

    async def js_async(self, script: str, *args: Any) -> Any:
        """
        Run C{script} in the page, which calls C{arguments[arguments.length - 1]} with
        its result (a promise's, say).
        """
        return await self.call(self.driver.execute_async_script, script, *args)

    async def until(self, script: str, message: str, timeout: float = 15.0, *args: Any) -> Any:
        """
        Poll C{script} (a function body) every 100 ms until it returns something truthy;
        fail the test with C{message} (and the URL) after C{timeout} seconds.
        """
        deadline = reactor.seconds() + timeout
        error: Exception | None = None
        while True:
            try:
                value = await self.js(script, *args)
            except Exception as e:  # a page in the middle of navigating
                value, error = None, e
            else:
                error = None
            if value:
                return value
            if reactor.seconds() > deadline:
                raise AssertionError(
                    f"{message} (after {timeout:g}s; at {await self.url()}; last error: {error})"
                )
            await deferLater(reactor, 0.1, lambda: None)

    async def new_tab(self, url: str) -> str:
        """
        Open C{url} in a new tab and switch to it; return its handle.
        """
        handle: str = await self.call(self._new_tab, url)
        return handle

    def _new_tab(self, url: str) -> str:
        self.driver.switch_to.new_window("tab")
        self.driver.get(url)
        return str(self.driver.current_window_handle)

    async def switch(self, handle: str) -> None:
        """
        Make the tab C{handle} the current one.
        """
        await self.call(self.driver.switch_to.window, handle)

    async def handle(self) -> str:
        """
        The current tab's handle.
        """
        current: str = await self.call(lambda: self.driver.current_window_handle)
        return current

    async def fill(self, css: str, value: str) -> None:
        """
        Type C{value} into the field matching C{css}.
        """

        def fill() -> None:
            from selenium.webdriver.common.by import By

            field = self.driver.find_element(By.CSS_SELECTOR, css)
            field.clear()
            field.send_keys(value)

        await self.call(fill)

    async def click(self, css: str) -> None:
        """
        Click the element matching C{css} (a submit button: the navigation it starts is
        not waited for; follow it with L{until}).
        """

        def click() -> None:
            from selenium.webdriver.common.by import By

            self.driver.find_element(By.CSS_SELECTOR, css).click()

        await self.call(click)

    async def submit(self, css: str, timeout: float = 15.0) -> None:
        """
        Click the submit button matching C{css} and wait until the page it leaves has
        gone (the next one may still be loading: follow with L{until}).
        """
        await self.js("window.__edgegwLeaving = true")
        await self.click(css)
        await self.until(
            "return window.__edgegwLeaving !== true", f"{css} did not leave the page", timeout
        )

    async def text(self) -> str:
        """
        The visible text of the current page.
        """
        body: str = await self.js("return document.body ? document.body.innerText : ''")
        return body

    def save(self, directory: str) -> None:
        """
        Write the current page, URL and console log under C{directory} (a failed test's).
        """
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "browser-page.html"), "w") as f:
            f.write(f"<!-- {self.driver.current_url} -->\n{self.driver.page_source}")
        try:
            entries = self.driver.get_log("browser")
        except Exception as e:  # not every driver keeps the console log
            entries = [{"message": f"no console log: {e}"}]
        with open(os.path.join(directory, "browser-console.log"), "w") as f:
            f.writelines(f"{entry.get('message')}\n" for entry in entries)


async def start_chromium(test: TestCase, arguments: tuple[str, ...] = ()) -> Chromium:
    """
    Start a headless Chromium for C{test} (quit when it ends), with C{arguments} added
    to its command line. Fails C{test} — never skips it — when Debian's chromium or
    chromium-driver is missing.
    """
    for program in (CHROMIUM, CHROMEDRIVER):
        if not os.access(program, os.X_OK):
            test.fail(f"{program} is missing: {SETUP_HINT}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        test.fail(f"selenium is not installed ({e}): run `make test`")
    profile = tempfile.mkdtemp(prefix="edgegw-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--password-store=basic",
        f"--user-data-dir={profile}",
        "--window-size=1024,768",
        *arguments,
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    log_path = os.path.join(os.path.abspath(test.mktemp()) + "-chromedriver.log")
    service = Service(executable_path=CHROMEDRIVER, log_output=log_path)
    # Selenium Manager (which downloads drivers) is not run: the driver's path is given.
    os.environ.setdefault("SE_OFFLINE", "true")
    driver = await deferToThread(lambda: webdriver.Chrome(service=service, options=options))
    browser = Chromium(driver)
    directory = os.path.abspath(test.mktemp())

    async def quit() -> None:
        # Kept in _trial_temp for a look after a failure (cheap enough to always write).
        await deferToThread(browser.save, directory)
        await deferToThread(driver.quit)
        shutil.rmtree(profile, ignore_errors=True)

    test.addCleanup(quit)
    return browser


async def log_in_at_provider(browser: Chromium, issuer: str, user: str) -> None:
    """
    At the provider's login form (tests/e2e/provider.mjs, which the browser must be
    on), log C{user} in and consent when asked; returns once the browser has left the
    provider (at C{issuer}).
    """
    await browser.until(
        "return document.querySelector('input[name=login]') !== null",
        "not on the provider's login form",
    )
    await browser.fill("input[name=login]", user)
    await browser.fill("input[name=password]", "any password")
    await browser.submit("button.login-submit")
    for _ in range(3):
        state = await browser.until(
            "if (document.querySelector('input[name=prompt][value=consent]'))"
            "  return 'consent';"
            "if (document.readyState === 'complete' && !location.href.startsWith(arguments[0]))"
            "  return 'left';"
            "return null;",
            "the provider never let the browser go",
            15.0,
            issuer,
        )
        if state == "left":
            return
        await browser.submit("button.login-submit")
    raise AssertionError("the provider asked for consent again and again")
