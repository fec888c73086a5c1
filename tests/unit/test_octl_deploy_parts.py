"""The pieces of ``octl deploy`` that need no server: the manifest, the age keys, progress, printing."""

from __future__ import annotations

import io
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from orchestrator.cli.octl import keys, manifest, output
from orchestrator.cli.octl.inputs import InputError
from orchestrator.cli.octl.progress import WaitProgress, format_duration
from orchestrator.protocol import age


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- manifest ---------------------------------------------------------------------------------------


def test_manifest__yaml_and_json_give_the_same_document() -> None:
    from_yaml = manifest.parse("workloads:\n  app:\n    outputs: {url: x}\n", "m.yaml")
    from_json = manifest.parse('{"workloads": {"app": {"outputs": {"url": "x"}}}}', "m.json")

    assert {"workloads": {"app": {"outputs": {"url": "x"}}}} == from_yaml == from_json


@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "{}\n"])
def test_manifest__an_empty_document_is_refused_saying_how_to_remove_deliberately(text: str) -> None:
    with pytest.raises(InputError, match="is empty: deploying it would remove every resource"):
        manifest.parse(text, "empty")


def test_manifest__explicit_no_workloads_and_shared_is_kept() -> None:
    assert {"workloads": {}} == manifest.parse("workloads: {}", "explicit")
    assert {"workloads": {}, "shared": {"db": {"type": "postgres"}}} == manifest.parse(
        "shared: {db: {type: postgres}}", "m"
    )


def test_manifest__dates_stay_strings() -> None:
    parsed = manifest.parse("workloads: {app: {outputs: {since: 2024-05-01}}}", "m")

    assert "2024-05-01" == parsed["workloads"]["app"]["outputs"]["since"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must be a mapping with workloads and shared, not list"),
        ("workloads: {}\nworkload: {}\n", "unknown top-level keys: workload (expected workloads and shared)"),
        ("workloads: [\n", "is not valid YAML or JSON: "),
    ],
)
def test_manifest__bad_documents_are_named(text: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        manifest.parse(text, "m.yaml")

    assert "the manifest in m.yaml" in str(caught.value)
    assert message in str(caught.value)


def test_manifest__invalid_yaml_says_where() -> None:
    with pytest.raises(InputError, match="line 2 column"):
        manifest.parse("workloads:\n  app: {a: [}\n", "m.yaml")


def test_manifest__dash_reads_stdin_but_not_a_terminal(tmp_path: Path) -> None:
    piped = manifest.read("-", io.StringIO("workloads: {app: {}}"))

    with pytest.raises(InputError, match="it is a terminal"):
        manifest.read("-", _Terminal())
    with pytest.raises(InputError, match="cannot read"):
        manifest.read(str(tmp_path / "missing.yaml"), io.StringIO())
    assert {"workloads": {"app": {}}} == piped


# -- keys -------------------------------------------------------------------------------------------


def test_keys__file_text_is_age_keygen_format_and_reads_back(tmp_path: Path) -> None:
    pair = keys.KeyPair.generate()
    path = tmp_path / "k.key"
    path.write_text(pair.file_text(now=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)))

    lines = path.read_text().splitlines()

    assert ["# created: 2025-01-02T03:04:05Z", f"# public key: {pair.recipient}", pair.identity] == lines
    assert pair.identity == keys.read_identity("--key", f"@{path}")
    assert pair.identity == keys.read_identity("--key", f"  {pair.identity}\n")
    assert pair.recipient == age.recipient_of(pair.identity)


def test_keys__each_pair_is_fresh() -> None:
    assert keys.KeyPair.generate().identity != keys.KeyPair.generate().identity


@pytest.mark.parametrize(
    "value",
    [
        "not-a-key",
        "AGE-SECRET-KEY-1NOTVALID",
        "age1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq",
        "",
    ],
)
def test_keys__bad_key_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(InputError) as caught:
        keys.read_identity("--key", value)

    assert str(caught.value).startswith("--key: ")
    assert not value or value not in str(caught.value)


def test_keys__file_with_two_keys_or_missing_file_is_refused(tmp_path: Path) -> None:
    two = tmp_path / "two.key"
    two.write_text(f"{keys.KeyPair.generate().identity}\n{keys.KeyPair.generate().identity}\n")

    with pytest.raises(InputError, match="expected one age secret key"):
        keys.read_identity("--key", f"@{two}")
    with pytest.raises(InputError, match="cannot read"):
        keys.read_identity("--key", f"@{tmp_path / 'missing.key'}")
    with pytest.raises(InputError, match="must be followed by a file name"):
        keys.read_identity("--key", "@")


def test_keys__save_writes_0600_in_a_0700_directory_and_never_overwrites(tmp_path: Path) -> None:
    directory = keys.prepare_directory(tmp_path / "keys" / "nested")
    pair = keys.KeyPair.generate()

    path = keys.save(directory, "d.logs.key", pair)

    assert 0o700 == stat.S_IMODE(directory.stat().st_mode)
    assert 0o600 == stat.S_IMODE(path.stat().st_mode)
    assert pair.identity == keys.read_identity("--key", f"@{path}")
    with pytest.raises(InputError, match="cannot write"):
        keys.save(directory, "d.logs.key", keys.KeyPair.generate())
    assert pair.identity == keys.read_identity("--key", f"@{path}")


def test_keys__directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")

    with pytest.raises(InputError, match="--save-keys: cannot create"):
        keys.prepare_directory(tmp_path / "file")


# -- progress ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (7.9, "7s"),
        (60, "1m00s"),
        (65, "1m05s"),
        (3600, "1h00m00s"),
        (3723, "1h02m03s"),
        (-3, "0s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert text == format_duration(seconds)


def test_progress__plain_lines_when_not_a_terminal() -> None:
    buffer, now = io.StringIO(), [100.0]
    console = Console(file=buffer, width=20)

    with WaitProgress(
        "Waiting for deployment d-0123456789", console=console, started=40.0, clock=lambda: now[0]
    ) as p:
        p.poll()
        now[0] += 3600
        p.poll()

    assert not p.live
    assert [
        "Waiting for deployment d-0123456789 (1m00s)",
        "Waiting for deployment d-0123456789 (1h01m00s)",
    ] == buffer.getvalue().splitlines()


def test_progress__a_live_status_line_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)

    with WaitProgress("Waiting for deployment d", console=console, started=0.0, clock=lambda: 65.0) as p:
        p.poll()

    shown = buffer.getvalue()
    assert p.live
    assert "Waiting for deployment d (1m05s)" in shown
    assert "\x1b[" in shown, "drawn with terminal control sequences"
    assert shown.count("Waiting for deployment d") <= 2, "poll adds no plain line"


# -- printing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ['resource "x" "y" {\n  a = 1\n}\n', "two\nlines", "trailing  \nspace", "x"])
def test_to_yaml__multiline_strings_are_literal_blocks_and_round_trip(text: str) -> None:
    printed = output.to_yaml({"tf": text})

    assert text == yaml.safe_load(printed)["tf"]
    if "\n" in text and "  \n" not in text:
        assert printed.startswith("tf: |")


def test_keys__default_directory_follows_octl_keys_dir_then_xdg_state_home(tmp_path: Path) -> None:
    from orchestrator.cli.octl.keys import default_directory

    assert tmp_path / "k" == default_directory({"OCTL_KEYS_DIR": str(tmp_path / "k")})
    assert tmp_path / "octl" / "keys" == default_directory({"XDG_STATE_HOME": str(tmp_path)})
    assert Path.home() / ".local" / "state" / "octl" / "keys" == default_directory({})
