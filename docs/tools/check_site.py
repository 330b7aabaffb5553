"""The built site in a real browser: `make docs-check` (run by .ci/run, not by `make test`).

    python docs/tools/check_site.py site --shots site-check

Serves SITE on 127.0.0.1 (a free port) and drives headless Debian Chromium with chromedriver
(the flags of DATA.md, as tests/inspect/test_viewer_browser.py does):

- the home page, the first tutorial and the studies page open and render: a visible heading and
  body text, and no error in the browser's console;
- navigation: clicking the nav link to the studies page lands there;
- search (Material's, offline): typing --search-word lists results, one linking to
  --search-page, and clicking it lands there;
- no request leaves the machine: every URL the pages request (Chrome's performance log) must be
  on localhost (or data:/blob:); any other is named and fails the check.

Screenshots of home, tutorial, studies and the search results go to --shots. Exit 1 with every
failure listed; the browser missing is a failure too (see .ci/install-browser).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]
LOCAL = {"127.0.0.1", "localhost"}
# Console errors that are not failures, each with why. MathJax 2's HTML-CSS output declares an
# @font-face `MathJax_Blank` at url('about:blank') to time the loading of its web fonts; Chrome
# reports that URL as blocked (nothing is requested; the math renders).
HARMLESS = ("Access to font at 'about:blank'", "about:blank - Failed to load resource")


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury the check's own
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def browser(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise SystemExit(f"docs-check: needs Chromium and chromedriver (found {binary}, {driver_path}): run "
                         ".ci/install-browser")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


class Check:
    """Runs the checks on one browser, collecting failures and every requested URL."""

    def __init__(self, driver, base: str, shots: Path):
        self.driver, self.base, self.shots = driver, base, shots
        self.failures: list[str] = []
        self.requests: list[str] = []

    def fail(self, what: str) -> None:
        print(f"  FAIL {what}")
        self.failures.append(what)

    def drain_logs(self, page: str) -> None:
        """Record the requests made so far; console errors fail the page."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self.requests.append(message["params"]["request"]["url"])
        for entry in self.driver.get_log("browser"):
            if entry["level"] == "SEVERE" and not any(h in entry["message"] for h in HARMLESS):
                self.fail(f"{page}: console error: {entry['message']}")

    def wait(self, condition, seconds: float = 15, what: str = "") -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                if condition():
                    return True
            except Exception:  # the page is still changing under the query
                pass
            time.sleep(0.2)
        if what:
            self.fail(what)
        return False

    def page(self, path: str, shot: str) -> None:
        """Open `path`: a visible h1 and body text, no console error; screenshot to `shot`."""
        from selenium.webdriver.common.by import By

        self.driver.get(self.base + path)
        self.wait(lambda: self.driver.execute_script("return document.readyState") == "complete")
        h1 = self.driver.find_elements(By.CSS_SELECTOR, "article h1")
        body = self.driver.find_elements(By.CSS_SELECTOR, "article p, article li, article .jp-Cell")
        if not h1 or not h1[0].is_displayed() or not h1[0].text.strip():
            self.fail(f"/{path}: no visible heading")
        if not any(e.is_displayed() and e.text.strip() for e in body):
            self.fail(f"/{path}: no visible body text")
        self.driver.save_screenshot(str(self.shots / shot))
        print(f"  page /{path}: heading {h1[0].text.strip()!r}" if h1 else f"  page /{path}")
        self.drain_logs(f"/{path}")

    def navigation(self, target: str) -> None:
        """From the home page, click the first nav link to `target` and land there."""
        from selenium.webdriver.common.by import By

        self.driver.get(self.base)
        links = [a for a in self.driver.find_elements(By.CSS_SELECTOR, "a.md-tabs__link, a.md-nav__link")
                 if a.is_displayed() and (a.get_attribute("href") or "").rstrip("/").endswith(target.rstrip("/"))]
        if not links:
            self.fail(f"navigation: no visible nav link to /{target}")
            return
        label = links[0].text.strip()
        links[0].click()
        self.wait(lambda: urlparse(self.driver.current_url).path.rstrip("/").endswith(target.rstrip("/")),
                  what=f"navigation: clicking the link to /{target} stayed on {self.driver.current_url}")
        print(f"  navigation: clicked {label!r}, now at {urlparse(self.driver.current_url).path}")
        self.drain_logs("navigation")

    def search(self, word: str, target: str) -> None:
        """Type `word` into the search box: a result links to `target`; clicking it lands there."""
        from selenium.webdriver.common.by import By

        self.driver.get(self.base)
        self.driver.find_element(By.CSS_SELECTOR, "label.md-search__icon, .md-search__input").click()
        box = self.driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
        self.wait(lambda: box.is_displayed())
        box.send_keys(word)
        found = []

        def results() -> bool:
            found[:] = [a.get_attribute("href") for a in
                        self.driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")]
            return any(target in (h or "") for h in found)

        ok = self.wait(results, 20, what=f"search {word!r}: no result links to /{target} (got {found[:5]})")
        self.driver.save_screenshot(str(self.shots / "search.png"))
        print(f"  search {word!r}: {len(found)} result links, e.g. {[urlparse(h).path for h in found[:3]]}")
        if ok:
            link = next(a for a in self.driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
                        if target in (a.get_attribute("href") or ""))
            link.click()
            self.wait(lambda: target in self.driver.current_url,
                      what=f"search: clicking the result did not open /{target}")
        self.drain_logs("search")

    def offline(self) -> None:
        """Every requested URL stays on this machine."""
        outside = sorted({u for u in self.requests
                          if urlparse(u).scheme not in ("data", "blob", "about", "chrome")
                          and urlparse(u).hostname not in LOCAL})
        for url in outside:
            self.fail(f"request left the machine: {url}")
        print(f"  requests: {len(self.requests)}, outside localhost: {len(outside)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (make docs: site/)")
    parser.add_argument("--shots", type=Path, default=Path("site-check"), help="screenshot folder (site-check/)")
    parser.add_argument("--search-word", default="sinusoidal", help="a word to search for (sinusoidal)")
    parser.add_argument("--search-page", default="reference/config/", help="a page it must find")
    args = parser.parse_args(argv)
    tutorials = sorted(p.parent.name for p in args.site.glob("tutorials/[0-9][0-9]-*/index.html"))
    if not (args.site / "index.html").exists() or not tutorials:
        print(f"docs-check: {args.site} holds no built site with tutorials (make docs builds it)", file=sys.stderr)
        return 1
    args.shots.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.site)
    profile = tempfile.mkdtemp(prefix="attnlab-docs-chromium-")
    driver = browser(profile)
    try:
        check = Check(driver, base, args.shots)
        print(f"docs-check: {args.site} at {base}")
        check.page("", "home.png")
        check.page(f"tutorials/{tutorials[0]}/", "tutorial.png")
        check.page("studies/", "studies.png")
        check.navigation("studies/")
        check.search(args.search_word, args.search_page)
        check.offline()
    finally:
        driver.quit()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    if check.failures:
        print(f"docs-check: {len(check.failures)} failure(s):\n  " + "\n  ".join(check.failures), file=sys.stderr)
        return 1
    print(f"docs-check: passed; screenshots in {args.shots}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
