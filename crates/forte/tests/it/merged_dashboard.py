"""One picture of a batch from edge to core, in a real browser (run by dashboard.rs).

Two sites (site-a and site-b, each a `send --watch` daemon) send a batch of the same name
through one relay; `forte dashboard` reads both edges' catalogues and the core's. Debian's
headless Chromium, driven by selenium, checks that:

- each batch shows as one row (not one per catalogue), whose phase only moves forward as it
  travels: sending, at the relay, then (once the core pulls) delivered;
- the totals count batches;
- the relay's page shows what `forte relay-store list --json` lists, number for number;
- the core's receipt is on the batch's page, and site-a's own daemon shows its batch
  delivered once it has verified the core's receipt;
- no page logs a console error.

With FORTE_SCREENSHOTS set to a directory, the overview, batch and relay pages are saved
there (docs/dashboard's merged-*.png and relay.png are made so).

Usage: merged_dashboard.py DASHBOARD RELAY_PAGE EDGE_A_PAGE INBOX_A INBOX_B FORTE STORE PULL_JSON
(PULL_JSON: the pull's arguments, a JSON list). Exits 0 when every check passed.
"""

import json
import os
import subprocess
import sys
import tempfile

from selenium.webdriver.common.by import By

from browser import browser, no_console_errors, text, wait, write_batch

ORDER = ["at_edge", "sending", "at_relay", "pulling", "checking", "delivered"]


def rows(driver, section):
    """The rows of a batch table: (key, phase, cells), read in one go (the section is
    replaced at every event)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#' + arguments[0] + ' tr[data-key]')]"
        ".map(r => [r.dataset.key, r.dataset.phase, [...r.cells].map(c => c.innerText)])",
        section)


def journey(key, cells):
    """A row's batch across catalogues: its site (once sealed) and id. Two sites sharing an
    edge key give a batch of one name one id: the site tells them apart."""
    return (cells[1], key.split("/")[-1])


def shot(driver, name):
    where = os.environ.get("FORTE_SCREENSHOTS")
    if where:
        os.makedirs(where, exist_ok=True)
        driver.save_screenshot(os.path.join(where, name))


def check(driver, dashboard, relay, edge_a, inbox_a, inbox_b, forte, store, pull):
    driver.get(dashboard + "/")
    wait("the dashboard goes live", 20, lambda: text(driver, "live-state") == "live")
    write_batch(inbox_a, "run-1", 4, 1_500_000)
    write_batch(inbox_b, "run-1", 4, 1_500_000)

    # Every phase each batch showed, in the order seen (by site and id: its key changes from
    # the edge's to the core's as the core takes it over; its site is known once it is sealed).
    seen = {}

    def look():
        for key, phase, cells in rows(driver, "recent"):
            if cells and cells[0] == "run-1":
                phases = seen.setdefault(journey(key, cells), [])
                if not phases or phases[-1] != phase:
                    phases.append(phase)
        return seen

    def both(phase):
        look()
        now = [(journey(k, c), p) for k, p, c in rows(driver, "recent") if c and c[0] == "run-1"]
        return len(now) == 2 and len(dict(now)) == 2 and all(p == phase for _, p in now)

    try:
        wait("both sites' batches are at the relay", 90, lambda: both("at_relay"))
    except AssertionError as e:
        raise AssertionError(f"{e}; phases seen {seen}; rows now {rows(driver, 'recent')}")
    recent = [c for _, _, c in rows(driver, "recent") if c and c[0] == "run-1"]
    assert len(recent) == 2, f"a batch is shown more than once: {recent}"
    assert sorted(c[1] for c in recent) == ["site-a", "site-b"], f"sites: {recent}"
    totals = text(driver, "totals")
    assert "2\nbatches" in totals or "2 batches" in totals, f"totals: {totals}"
    assert "2\nat the relay" in totals or "2 at the relay" in totals, f"totals: {totals}"
    shot(driver, "merged-at-relay.png")
    no_console_errors(driver, "the dashboard")

    # The relay's page: what its store holds, as `forte relay-store list` lists it.
    driver.get(relay + "/")
    wait("the relay's page goes live", 20, lambda: text(driver, "live-state") == "live")
    listed = json.loads(subprocess.run([forte, "relay-store", "list", "--store", store, "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    want = sorted((h["site"], h["batch"] or "", h["objects"], h["bytes"]) for h in listed)

    def shown():
        return sorted(driver.execute_script(
            "return [...document.querySelectorAll('#relay-batches tr.held')].map(r => "
            "[r.dataset.site, r.dataset.batch, +r.dataset.objects, +r.dataset.bytes])"))

    wait(f"the relay's page shows what relay-store list does: {want}", 20,
         lambda: [tuple(r) for r in shown()] == want)
    assert "site-a" in text(driver, "relay-sites") and "1.00 GiB" in text(driver, "relay-sites"), \
        text(driver, "relay-sites")
    print(f"relay: {len(want)} batches held, as relay-store list says: {want}")
    shot(driver, "relay.png")
    no_console_errors(driver, "the relay's page")

    # The core pulls: each row moves on to delivered.
    driver.get(dashboard + "/")
    wait("the dashboard goes live again", 20, lambda: text(driver, "live-state") == "live")
    puller = subprocess.Popen([forte, *pull])
    try:
        wait("both batches are delivered", 90, lambda: both("delivered"))
    except AssertionError as e:
        raise AssertionError(f"{e}; phases seen {seen}; rows now {rows(driver, 'recent')}")
    assert puller.wait(60) == 0, "the pull failed"
    for batch, phases in seen.items():
        ranks = [ORDER.index(p) for p in phases]
        assert ranks == sorted(ranks), f"batch {batch} went back: {phases}"
    for site in ["site-a", "site-b"]:
        phases = [p for (s, _), p in seen.items() if s == site]
        assert len(phases) == 1, f"{site}: {seen}"
        assert "at_relay" in phases[0] and phases[0][-1] == "delivered", f"{site}: {phases}"
    assert any("sending" in p for p in seen.values()), f"no batch was seen sending: {seen}"
    print("phases seen:", seen)
    totals = text(driver, "totals")
    assert "2\ndelivered" in totals or "2 delivered" in totals, f"totals: {totals}"
    shot(driver, "merged-overview.png")
    no_console_errors(driver, "the dashboard")

    # A batch's page: where it is, and the core's receipt.
    link = [e for e in driver.find_elements(By.CSS_SELECTOR, "#recent tr[data-key] a")
            if e.text == "run-1"][0]
    link.click()
    wait("the batch page shows the core's receipt", 20,
         lambda: "signed by this core" in text(driver, "batch-receipts"))
    assert text(driver, "phase") == "delivered", text(driver, "phase")
    driver.execute_script("document.getElementById('batch-stages').scrollIntoView()")
    shot(driver, "merged-batch.png")
    no_console_errors(driver, "the batch page")

    # site-a's own daemon: delivered once it has the core's receipt, verified.
    driver.get(edge_a + "/")
    wait("site-a's daemon shows its batch delivered", 60,
         lambda: any(p == "delivered" and c[0] == "run-1" for _, p, c in rows(driver, "recent")))
    driver.find_element(By.LINK_TEXT, "run-1").click()
    wait("its batch page shows the receipt it verified", 20,
         lambda: "verified at the edge" in text(driver, "batch-receipts"))
    no_console_errors(driver, "site-a's daemon")


def main(*argv):
    dashboard, relay, edge_a, inbox_a, inbox_b, forte, store, pull = argv
    with tempfile.TemporaryDirectory() as profile:
        driver = browser(profile)
        try:
            check(driver, dashboard, relay, edge_a, inbox_a, inbox_b, forte, store, json.loads(pull))
        finally:
            driver.quit()


if __name__ == "__main__":
    try:
        main(*sys.argv[1:9])
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
