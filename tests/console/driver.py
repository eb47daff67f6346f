"""What the browser tests do with the console: sign in, open a page, wait for something on
it, read the browser's console log, save a screenshot."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By


class Console:
    def __init__(self, driver: Any, url: str, shots: Path) -> None:
        self.d = driver
        self.url = url
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def sign_in(self, key: str) -> None:
        """Load the console in a fresh state and give it `key` through the sign-in form."""
        self.d.get(f"{self.url}/console/static/favicon.svg")  # this origin, and no script
        self.d.execute_script("sessionStorage.clear()")
        self.d.get(f"{self.url}/console#/jobs")
        field = self.wait(lambda: self.visible("#key-input"), "the sign-in form")
        field.send_keys(key)
        self.d.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
        self.wait(lambda: self.visible("#who .tenant, #who .operator"), "signed in")

    def go(self, page: str) -> None:
        self.d.execute_script("location.hash = arguments[0]", f"#/{page}")
        name = page.split("/")[0]
        self.wait(lambda: self.d.find_element(By.ID, "main").get_attribute("data-page") == name,
                  f"page {page}")  # fmt: skip

    def visible(self, css: str) -> Any:
        for el in self.d.find_elements(By.CSS_SELECTOR, css):
            if el.is_displayed():
                return el
        return None

    def attr(self, css: str, name: str) -> str | None:
        els = self.d.find_elements(By.CSS_SELECTOR, css)
        return els[0].get_attribute(name) if els else None

    def text(self, css: str) -> str:
        els = self.d.find_elements(By.CSS_SELECTOR, css)
        return els[0].text if els else ""

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except (StaleElementReferenceException, WebDriverException):
                value = None  # the page redrew under us: ask again
            if value:
                return value
            time.sleep(0.05)
        self.screenshot(f"timeout-{what.replace(' ', '-')[:40]}")
        raise AssertionError(f"timed out waiting for {what}; errors: {self.errors()}")

    def errors(self) -> list[str]:
        """SEVERE entries of the browser's console since the last call (the log is drained)."""
        return [e["message"] for e in self.d.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, name: str) -> Path:
        """The whole page: the window grows to the page's height for the shot."""
        path = self.shots / f"{name}.png"
        size = self.d.get_window_size()
        height = self.d.execute_script("return document.documentElement.scrollHeight")
        self.d.set_window_size(size["width"], max(size["height"], min(int(height) + 140, 4000)))
        try:
            self.d.save_screenshot(str(path))
        finally:
            self.d.set_window_size(size["width"], size["height"])
        return path
