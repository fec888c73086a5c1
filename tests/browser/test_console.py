"""The web console end to end in headless Chromium against a real server with real deployments, on each
database: sign in and out, the runners page and its editor, refresh_runner's dry run, a deployment's logs
and outputs decrypted in the page, usage, another organization's and a viewer's tokens, script in API
data, and axe-core on every page. Screenshots of each page go to docs/screenshots/."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.octl.log_render import LogRenderer
from orchestrator.protocol import age
from tests.support import browser
from tests.support.browser import PHONE, Tab, check_accessible, screenshot
from tests.support.console_site import HOSTILE_DESCRIPTION, Site
from tests.support.log_samples import sample_log

try:
    from playwright.sync_api import expect
except ImportError:  # skipped here, failed in CI
    browser.missing(browser.NO_PLAYWRIGHT, module=True)

pytestmark = pytest.mark.slow


def sign_in(tab: Tab, site: Site, token: str = "admin") -> None:
    page = tab.page
    page.goto(f"{site.url}/")
    expect(page).to_have_url(re.compile(r"/console/#/sign-in$"))
    page.get_by_label("API token").fill(site.tokens[token])
    page.get_by_role("button", name="Sign in").click()
    if token != "platform":
        expect(page.get_by_role("heading", level=1, name="Runners")).to_be_visible()


def accessible(tab: Tab, axe: str) -> None:
    assert [] == check_accessible(tab.page, axe), (
        f"axe-core: serious or critical violations on {tab.page.url}"
    )


def session_storage(tab: Tab) -> dict[str, str]:
    stored: dict[str, str] = tab.page.evaluate("() => Object.fromEntries(Object.entries(sessionStorage))")
    return stored


def test_console__sign_in_see_the_runners_and_sign_out(tab: Tab, site: Site, axe: str) -> None:
    page = tab.page
    page.goto(f"{site.url}/")
    accessible(tab, axe)
    screenshot(page, "sign-in")

    sign_in(tab, site)

    local = page.locator("article[data-runner='local']")
    expect(local).to_contain_text("vm")
    expect(local).to_contain_text("orchestrator")
    expect(local).to_contain_text("This server can launch it")
    expect(local).to_contain_text("any project, any environment type")
    expect(local).to_contain_text("shop / dev")
    edge = page.locator("article[data-runner='edge']")
    expect(edge).to_contain_text("s3")
    expect(edge).to_contain_text("Launched by its agent; last seen: never")
    expect(edge).to_contain_text("environment type staging")
    managed = page.locator("article[data-runner='managed']")
    expect(managed).to_contain_text("Managed by the platform")
    expect(managed.get_by_role("link", name=re.compile("Edit"))).to_have_count(0)
    expect(local.get_by_role("link", name="Edit runner local")).to_be_visible()
    assert site.tokens["admin"] == session_storage(tab)["po.console.token"]
    accessible(tab, axe)
    screenshot(page, "runners")

    page.get_by_role("button", name="Sign out").click()

    expect(page.get_by_role("heading", level=1, name="Sign in")).to_be_visible()
    assert {} == session_storage(tab)
    page.goto(f"{site.url}/console/#/runners")
    expect(page).to_have_url(re.compile(r"#/sign-in$"))


def test_console__a_runner_description_with_script_shows_as_text(tab: Tab, site: Site) -> None:
    sign_in(tab, site)

    description = tab.page.locator("article[data-runner='edge'] .description")

    expect(description).to_have_text(HOSTILE_DESCRIPTION)
    assert tab.page.evaluate("() => window.__injected === undefined")
    assert (
        0 == tab.page.locator("article[data-runner='edge'] script, article[data-runner='edge'] img").count()
    )


def test_console__a_platform_admin_picks_an_organization(tab: Tab, site: Site, axe: str) -> None:
    page = tab.page
    sign_in(tab, site, "platform")
    expect(page.get_by_role("heading", level=1, name="Choose an organization")).to_be_visible()
    accessible(tab, axe)
    screenshot(page, "organizations")

    page.get_by_role("button", name="globex").click()

    expect(page.get_by_role("heading", level=1, name="Runners")).to_be_visible()
    expect(page.get_by_role("link", name="Organization: globex")).to_be_visible()
    assert "globex" == session_storage(tab)["po.console.org"]


def test_console__a_runner_with_an_invalid_field_shows_the_apis_message_beside_it(
    tab: Tab, site: Site, axe: str
) -> None:
    page = tab.page
    sign_in(tab, site)
    page.get_by_role("link", name="New runner").click()
    expect(page.get_by_role("heading", level=1, name="New runner")).to_be_visible()
    page.get_by_label("Runner ID").fill("lab")
    page.get_by_label("Runner (YAML)").fill(
        "description: a lab machine\n"
        "runner_configuration:\n"
        "  type: vm\n"
        "  connection:\n"
        "    type: agent\n"
        "    key: not a key\n"
        "  job:\n"
        "    runtime: process\n"
        "state_storage_configuration:\n"
        "  type: s3\n"
        "  bucket: lab-state\n"
    )

    page.get_by_role("button", name="Create runner").click()

    message = page.locator("#runner-yaml-errors li[data-field='runner_configuration.connection.key']")
    expect(message).to_contain_text("Line 6")
    expect(message).to_contain_text("does not look like an ed25519 public key in PEM format")
    expect(page.get_by_label("Runner (YAML)")).to_have_attribute("aria-invalid", "true")
    # The message is part of the editor's description, read with the field.
    described = page.get_by_label("Runner (YAML)").get_attribute("aria-describedby") or ""
    assert "runner-yaml-errors" in described.split()
    accessible(tab, axe)
    screenshot(page, "runner-editor-error")

    message.get_by_role("button", name="Line 6").click()
    selected = page.evaluate(
        "() => { const t = document.getElementById('runner-yaml'); "
        "return t.value.slice(t.selectionStart, t.selectionEnd); }"
    )
    assert "    key: not a key" == selected
    assert 404 == site.get("/orgs/acme/runners/lab").status_code


def test_console__editing_a_runner_sends_back_only_what_changed_never_a_secret(tab: Tab, site: Site) -> None:
    page = tab.page
    sign_in(tab, site)
    page.get_by_role("link", name="Edit runner cluster").click()
    editor = page.get_by_label("Runner (YAML)")
    expect(editor).to_have_value(re.compile(r"service_account_token: SECRET"))
    text = editor.input_value()

    editor.fill(text.replace('description: ""', "description: the lab cluster"))
    page.get_by_role("button", name="Save changes").click()

    expect(page.get_by_role("status").first).to_contain_text("Runner cluster saved.")
    expect(page.locator("article[data-runner='cluster'] .description")).to_have_text("the lab cluster")
    [patch] = [sent for sent in tab.recorder.requests if sent.method == "PATCH"]
    assert {"description": "the lab cluster"} == json.loads(patch.body or "")
    assert "the lab cluster" == site.get("/orgs/acme/runners/cluster").json()["description"]


def test_console__refresh_runner_shows_the_dry_run_then_links_on_confirm(
    tab: Tab, site: Site, axe: str
) -> None:
    page = tab.page
    sign_in(tab, site)
    page.get_by_role("link", name="Environments").click()
    staging = page.locator("tr[data-env='shop/staging']")
    expect(staging.locator("td.runner")).to_have_text("none linked")
    expect(page.locator("tr[data-env='shop/dev']")).to_contain_text("succeeded")
    screenshot(page, "environments")
    accessible(tab, axe)

    staging.get_by_role("button", name="Refresh runner of shop / staging").click()

    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".dry-run")).to_contain_text(
        "the runner rules would link edge (no runner linked now)"
    )
    # A dry run: nothing changed yet.
    assert "runner_id" not in site.get("/orgs/acme/projects/shop/envs/staging").json()
    accessible(tab, axe)
    screenshot(page, "refresh-runner-dry-run")

    dialog.get_by_role("button", name="Confirm").click()

    expect(dialog).to_contain_text("Linked shop / staging to runner edge.")
    expect(staging.locator("td.runner")).to_have_text("edge")
    assert "edge" == site.get("/orgs/acme/projects/shop/envs/staging").json()["runner_id"]
    dialog.get_by_role("button", name="Close").click()
    expect(page.get_by_role("dialog")).to_have_count(0)


def test_console__a_deployment_decrypted_in_the_page_and_no_request_carries_the_identity(
    tab: Tab, site: Site, axe: str
) -> None:
    page = tab.page
    deployment, identity = site.deployment, site.deployment["_identity"]
    sign_in(tab, site)
    page.get_by_role("link", name="Deployments").click()
    row = page.locator(f"tr[data-deployment='{deployment['id']}']")
    expect(row).to_contain_text("succeeded")
    expect(row).to_contain_text("shop / dev")
    accessible(tab, axe)
    screenshot(page, "deployments")
    row.get_by_role("link", name=deployment["id"]).click()
    expect(page.locator("#deployment-summary")).to_contain_text("2 added, 0 changed, 0 removed")
    expect(page.locator("#log-state")).to_contain_text("give your age identity")
    page.get_by_text("Compiled Terraform (main.tf)").click()
    expect(page.locator("#tf")).to_contain_text('output "shop"')
    accessible(tab, axe)

    page.get_by_label("Age identity").fill(f"# created: now\n{identity}\n")
    page.get_by_role("button", name="Decrypt").click()

    outputs = page.locator("#outputs pre")
    expect(outputs).to_contain_text('"url": "https://shop.example.test/bucket-shop"')
    log = page.locator("#log")
    expect(log).to_contain_text("Apply complete! Resources: 2 added, 0 changed, 0 destroyed.")
    # Terraform's JSON lines rendered: their messages, not the JSON.
    expect(log).not_to_contain_text('"@message"')
    expect(page.get_by_label("Age identity")).to_have_value("")
    accessible(tab, axe)
    screenshot(page, "deployment")
    assert [] == tab.recorder.carrying(identity)
    assert [] == tab.recorder.carrying(identity.lower())
    assert [] == [
        sent.url for sent in tab.recorder.requests if "decryptkey" in (k.lower() for k in sent.headers)
    ]
    assert [] == [key for key in session_storage(tab) if identity in session_storage(tab)[key]]


def test_console__usage_chart_and_csv_download(tab: Tab, site: Site, axe: str) -> None:
    page = tab.page
    sign_in(tab, site)
    page.get_by_role("link", name="Usage").click()
    chart = page.locator("#usage-chart")
    expect(chart.locator("g.bar[data-row='shop/dev']")).to_have_count(1)
    expect(chart.locator("g.bar[data-row='shop/dev'] rect.self-hosted")).to_have_count(1)
    expected = site.get("/orgs/acme/usage").json()["rows"][0]
    expect(chart.locator("g.bar[data-row='shop/dev'] text.value")).to_have_text(
        f"{expected['runnerMinutes']:.2f} min"
    )
    accessible(tab, axe)
    screenshot(page, "usage")

    with page.expect_download() as download_info:
        page.get_by_role("button", name="Download CSV").click()

    download = download_info.value
    assert re.fullmatch(r"usage-acme-\d{8}T\d{6}Z-\d{8}T\d{6}Z\.csv", download.suggested_filename)
    [line] = list(csv.DictReader(io.StringIO(Path(download.path()).read_bytes().decode(), newline="")))
    assert ("acme", "shop", "dev", f"{expected['runnerMinutes']:.2f}") == (
        line["org_id"],
        line["project_id"],
        line["env_id"],
        line["runner_minutes"],
    )


def test_console__another_organizations_token_sees_nothing_of_this_one(tab: Tab, site: Site) -> None:
    page = tab.page
    sign_in(tab, site, "other")

    expect(page.get_by_text("Organization: globex")).to_be_visible()
    expect(page.locator("article[data-runner='local']")).to_have_count(0)
    page.get_by_role("link", name="Environments").click()
    expect(page.get_by_text("No project yet.")).to_be_visible()
    page.get_by_role("link", name="Deployments").click()
    expect(page.get_by_text("No deployment (all projects).")).to_be_visible()
    page.goto(f"{site.url}/console/#/deployments/{site.deployment['id']}")
    expect(page.get_by_role("alert")).to_contain_text(f"deployment '{site.deployment['id']}' not found")
    # Changing the organization in the tab's storage reaches nothing either: the API decides.
    page.evaluate("() => sessionStorage.setItem('po.console.org', 'acme')")
    page.goto(f"{site.url}/console/#/usage")
    expect(page.get_by_role("alert")).to_contain_text("organization 'acme' not found")


def test_console__a_viewer_sees_no_edit_controls_and_is_refused_anyway(
    tab: Tab, site: Site, axe: str
) -> None:
    page = tab.page
    sign_in(tab, site, "viewer")

    expect(page.locator("article[data-runner='local']")).to_be_visible()
    expect(page.get_by_role("link", name="New runner")).to_have_count(0)
    expect(page.get_by_role("link", name=re.compile("^Edit runner"))).to_have_count(0)
    page.get_by_role("link", name="Environments").click()
    expect(page.locator("tr[data-env='shop/dev']")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("Refresh runner"))).to_have_count(0)
    page.goto(f"{site.url}/console/#/runners/local/edit")
    expect(page.get_by_role("alert")).to_contain_text("Your role (viewer) may not change runners.")
    accessible(tab, axe)
    # The page's own API call, made anyway with the viewer's token: the API refuses it.
    refused: dict[str, Any] = page.evaluate(
        """async () => {
            const r = await fetch('../orgs/acme/runners/local', {method: 'PATCH',
                headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('po.console.token'),
                          'Content-Type': 'application/json'},
                body: JSON.stringify({description: 'changed by a viewer'})});
            return {status: r.status, body: await r.json()};
        }"""
    )
    assert (403, "role 'viewer' may not manage in organization 'acme'") == (
        refused["status"],
        refused["body"]["message"],
    )


def test_console__readable_on_a_phone(tab: Tab, site: Site, axe: str) -> None:
    page = tab.page
    page.set_viewport_size(PHONE)
    sign_in(tab, site)
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], "the runners page scrolls sideways on a phone"
    accessible(tab, axe)
    screenshot(page, "phone-runners")
    page.goto(f"{site.url}/console/#/deployments/{site.deployment['id']}")
    expect(page.locator("#deployment-summary")).to_contain_text("succeeded")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "phone-deployment")


def test_console__renders_a_log_as_octl_logs_does(tab: Tab, site: Site) -> None:
    """The console's renderer (js/tflog.js) is a port of octl's: the same text for every kind of line,
    and for the real log of a deployment."""
    page = tab.page
    page.goto(f"{site.url}/console/")
    expect(page.get_by_role("heading", level=1, name="Sign in")).to_be_visible()
    ciphertext = site.get(f"/orgs/acme/deployments/{site.deployment['id']}/actions/get-logs").text
    real = age.decrypt_b64(ciphertext, site.deployment["_identity"]).decode()

    for log in (sample_log(), real):
        rendered = page.evaluate(
            """async text => {
                const module = await import(new URL('js/tflog.js', document.baseURI).href);
                return new module.LogRenderer().text(text).map(piece => piece.text).join('');
            }""",
            log,
        )

        assert LogRenderer().text(log) == rendered


def test_console__a_deployment_followed_live_to_success(
    tab: Tab, site: Site, axe: str, tmp_path: Path
) -> None:
    """Last of the module: the demo module stays slow afterwards. The page follows the live log (the
    API's server-sent events, decrypted chunk by chunk): the plan's lines show while the apply sleeps.
    The identity is read from a file, as age-keygen writes one."""
    page = tab.page
    deployment_id, identity = site.start_slow_deployment("live", seconds=8)
    key_file = tmp_path / "deployment.key"
    key_file.write_text(
        f"# created: 2026-01-01T00:00:00Z\n# public key: {age.recipient_of(identity)}\n{identity}\n"
    )
    sign_in(tab, site)
    page.goto(f"{site.url}/console/#/deployments/{deployment_id}")
    page.get_by_label("Or read it from a file").set_input_files(str(key_file))
    expect(page.locator("#age-identity-state")).to_contain_text(age.recipient_of(identity))
    log = page.locator("#log")

    expect(log).to_contain_text("Plan: 2 to add, 0 to change, 0 to destroy.", timeout=60_000)

    # Shown while the deployment still executes: the apply sleeps after the plan.
    assert "executing" == site.get(f"/orgs/acme/deployments/{deployment_id}").json()["status"]
    expect(page.locator("#log-state")).to_contain_text("Following live.")
    screenshot(page, "deployment-live")
    summary = page.locator("#deployment-summary")
    expect(summary.locator(".badge")).to_have_text("succeeded", timeout=90_000)
    expect(log).to_contain_text("Apply complete! Resources: 2 added, 0 changed, 0 destroyed.")
    expect(log).to_contain_text("terraform_data.bucket (local-exec): ")
    for phase in ("Queued", "Launching", "Init", "Plan", "Apply", "Reporting"):
        expect(page.locator(".timeline")).to_contain_text(phase)
    expect(page.locator("#outputs pre")).to_contain_text("https://slow.example.test/bucket-slow")
    accessible(tab, axe)
    streams = [sent for sent in tab.recorder.requests if "/logs?" in sent.url]
    assert streams and all("follow=true" in sent.url for sent in streams)
    assert [] == tab.recorder.carrying(identity)
