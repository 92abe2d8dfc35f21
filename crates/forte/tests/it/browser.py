"""The dashboard in a real browser while a real transfer runs (run by dashboard.rs).

Debian's headless Chromium, driven by selenium through chromedriver, opens the sender's
dashboard and, without reloading it, sees: the page go live on its event stream and keep
updating; a batch in flight whose numbers change, with an ETA; the batch sent; a batch the
relay refuses appear in the failures and the alerts; and at the core, a delivered file's
lineage page listing its events. No console error is allowed on any page.

Usage: browser.py EDGE_URL CORE_URL INBOX. Exits 0 when every check passed; otherwise prints
what failed and exits 1.
"""

import json
import os
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("FORTE_TEST_CHROMIUM", "/usr/bin/chromium")
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1440,900",
        f"--user-data-dir={profile}",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("FORTE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def wait(what, seconds, check):
    """Polls `check` until it returns something true; fails naming `what`. An element replaced
    by a live update while it was read is read again."""
    until = time.monotonic() + seconds
    while True:
        try:
            got = check()
        except StaleElementReferenceException:
            got = None
        if got:
            return got
        if time.monotonic() > until:
            raise AssertionError(f"after {seconds} s: {what}")
        time.sleep(0.2)


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def events(driver):
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-events") or 0)


def write_batch(inbox, name, files, size):
    """A ready batch of `files` incompressible files, written beside the inbox and moved in."""
    staging = os.path.join(os.path.dirname(inbox), f".{name}")
    os.makedirs(staging)
    for i in range(files):
        with open(os.path.join(staging, f"{i:03}.bin"), "wb") as f:
            f.write(os.urandom(size))
    os.rename(staging, os.path.join(inbox, name))
    open(os.path.join(inbox, name, ".ready"), "wb").close()


def delivered_file(core):
    """The object id of the batch "moving"'s first file once the core acknowledged it."""
    url = core + "/api/v1/files?name=000.bin&role=core&state=acknowledged"
    with urllib.request.urlopen(url) as answer:
        files = json.load(answer)["files"]
    return files[0]["object_id"] if files else None


def no_console_errors(driver, page):
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, f"console errors on {page}: {severe}"


def main(edge, core, inbox):
    with tempfile.TemporaryDirectory() as profile:
        driver = browser(profile)
        try:
            check(driver, edge, core, inbox)
        finally:
            driver.quit()


def check(driver, edge, core, inbox):
    driver.get(edge + "/")
    wait("the page goes live", 20, lambda: text(driver, "live-state") == "live")
    first, stamp = events(driver), text(driver, "updated")
    wait("the page keeps updating", 10, lambda: events(driver) >= first + 2)
    assert text(driver, "updated") != stamp, "the updated time did not move"
    print(f"live: {events(driver)} events, updated {text(driver, 'updated')}")

    # A batch in flight: its row appears without a reload, and its numbers change.
    write_batch(inbox, "moving", 4, 2_000_000)
    row = '#in-flight tr[data-key] td'
    wait("the batch appears in flight", 30,
         lambda: "moving" in text(driver, "in-flight") and "sending" in text(driver, "in-flight"))
    seen = set()

    def moved():
        # Read in one go: the section is replaced at every event.
        cells = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(c => c.innerText)", row)
        if "moving" in cells and "sending" in cells:
            seen.add(tuple(cells))
        return len({c[4] for c in seen if len(c) > 4}) >= 2

    wait("the batch's done bytes change while it is sent", 30, moved)
    etas = [c[6] for c in seen if len(c) > 6]
    assert any(e not in ("", "–") for e in etas), f"no ETA shown: {etas}"
    print(f"in flight: {len(seen)} different rows, ETAs {sorted(set(etas))}")
    # Sent: the relay holds it, and once the sender has the core's receipt, delivered.
    wait("the batch is sent", 60, lambda: ("at the relay" in text(driver, "recent") or
                                           "delivered" in text(driver, "recent")) and
         "sending" not in text(driver, "in-flight"))

    # A batch the relay refuses (larger than its quota, with nothing held that a pull could
    # free): the failure and the alert appear on the open page.
    object_id = wait("the batch is delivered at the core", 60, lambda: delivered_file(core))
    write_batch(inbox, "too-big", 1, 12_000_000)
    wait("the refusal appears in the failures", 60, lambda: "413" in text(driver, "failures"))
    wait("a critical alert names the batch", 20,
         lambda: driver.find_elements(By.CSS_SELECTOR, "#alerts li.critical")
         and "too-big" in text(driver, "alerts"))
    print("failure:", text(driver, "alerts").splitlines()[0])
    no_console_errors(driver, "the sender's overview")

    # At the core: a delivered file's lineage page lists its events.
    driver.get(f"{core}/files/{object_id}")
    lineage = text(driver, "lineage")
    for state in ["verified", "delivered", "acknowledged"]:
        assert state in lineage, f"{state} missing from the lineage page: {lineage}"
    print("lineage:", " → ".join(
        e.text for e in driver.find_elements(By.CSS_SELECTOR, "#lineage tr.event td.state")))
    no_console_errors(driver, "the lineage page")

    # The batch page goes live too.
    driver.get(core + "/")
    wait("the core's page goes live", 20, lambda: text(driver, "live-state") == "live")
    driver.find_element(By.LINK_TEXT, "moving").click()
    wait("the batch page goes live", 20, lambda: text(driver, "live-state") == "live")
    assert "000.bin" in text(driver, "batch-files")
    no_console_errors(driver, "the batch page")


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
