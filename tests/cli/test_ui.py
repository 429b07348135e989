"""``loomflow ui``: its help, its refusals of bad flags and settings, the extra it names
when [ui] is missing, and, as its own process, where it listens and what it asks of a
request: the loopback only by default, a token beyond it (a one-time login link, a
bearer token), and Ctrl-C ending it with a stream open."""

from __future__ import annotations

import http.client
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from loomflow import cli as command_line
from tests.support.cli import Cli
from tests.support.console_app import Journal, make_journal, ui_process, user_env

TOKEN = "the-consoles-token-0123456789abcdef"


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return make_journal(tmp_path_factory.mktemp("console") / "journal.db")


def test_the_help_says_what_it_serves_where_and_how_it_is_guarded(cli: Cli) -> None:
    done = cli("ui", "--help")
    assert done.code == 0 and done.out.startswith("usage: loomflow ui ")
    text = " ".join(done.out.split())
    for option in ("--db", "--dsn", "--schema", "--host", "--port", "--user", "--read-only"):
        assert option in text
    assert "--agent module:factory" in text
    assert "LOOMFLOW_UI_HOST:LOOMFLOW_UI_PORT (default 127.0.0.1:8765)" in text
    assert "beyond the loopback every request needs a token (LOOMFLOW_UI_TOKEN" in text
    assert "one-time login link" in text
    assert "another user's ids read as unknown" in text
    listed = cli("--help")
    assert re.search(r"^\s+ui\s+the web console", listed.out, flags=re.M), listed.out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--port", "http"], "argument --port: 'http' is not a port number"),
        (["--port", "70000"], "argument --port: 70000 is not a port: one of 0 to 65535"),
        (["--port", "-1"], "is not a port"),
        (["--user", "a b"], "argument --user: "),
        (["--db", "j.db", "--dsn", "postgresql://x/y"], "not allowed with argument --db"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_flag_is_exit_2_with_what_is_wrong(cli: Cli, argv: list[str], says: str) -> None:
    done = cli("ui", *argv)
    assert done.code == 2
    assert says in done.err and done.err.startswith("usage: loomflow"), done.err
    assert done.out == ""


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--schema", "s"],
            "loomflow ui: --schema goes with a PostgreSQL read model, not with --db",
        ),
        (["--agent", "no_such_module_here:agents"], "loomflow ui: --agent: cannot import"),
        (["--agent", "os"], "loomflow ui: --agent: 'os' is not module:factory"),
    ],
)
def test_a_bad_combination_is_exit_2_before_it_listens(
    cli: Cli, tmp_path: Path, argv: list[str], says: str
) -> None:
    db = tmp_path / "journal.db"
    db.touch()  # there, so that what is refused is the combination
    done = cli("ui", "--db", str(db), *argv)
    assert done.code == 2 and done.err.startswith(says), done.err
    assert "loomflow console on" not in done.err


@pytest.mark.parametrize(
    ("variable", "value"), [("LOOMFLOW_UI_PORT", "eighty"), ("LOOMFLOW_UI_TOKEN", "short")]
)
def test_a_bad_setting_is_exit_2_naming_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """The variable by its name, on one line, and not its value (a DSN or a key may be
    among them): pydantic's several lines and its link were printed whole."""
    monkeypatch.setenv(variable, value)
    done = cli("ui", "--db", str(tmp_path / "journal.db"))
    assert done.code == 2
    (line,) = done.err.splitlines()
    assert line.startswith(f"loomflow: invalid setting {variable}: "), line
    assert value not in line and "pydantic" not in line


@pytest.mark.parametrize(
    "module", ["fastapi", "jinja2", "python_multipart", "sse_starlette", "uvicorn"]
)
def test_without_the_ui_extra_it_names_the_extra(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """As if one module of [ui] were not installed: the command says which extra."""
    monkeypatch.setattr(command_line, "_installed_from", lambda: None)  # from the index
    for name in [m for m in sys.modules if m.split(".")[0] in (module, "loomflow")]:
        if name.split(".")[0] == module or name.startswith("loomflow.ui"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # import it: ModuleNotFoundError
    done = cli("ui", "--db", str(tmp_path / "journal.db"))
    assert done.code == 2
    assert done.err == (
        f"loomflow ui needs {module!r}, which comes with the [ui] extra: "
        "pip install 'loomflow-durable[ui]'\n"
    )


# -- as a process of its own -----------------------------------------------------------


def own_address() -> str:
    """This machine's address on its network (not the loopback): the source address of
    its route outwards (a datagram socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, unused
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), "this machine has no address beyond the loopback"
    return address


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def test_with_its_defaults_it_listens_on_the_loopback_only(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    with ui_process(tmp_path, "--db", str(journal.db)) as ui:
        assert ui.url == "http://127.0.0.1:8765/"
        assert ui.login is None and "login" not in ui.stderr()
        listing = httpx.get(f"{ui.url}api/sessions")
        assert listing.status_code == 200 and listing.json()["total_sessions"] == journal.count
        page = httpx.get(ui.url)
        assert page.status_code == 200 and journal.alice[0] in page.text
        assert refused(own_address(), 8765)
        # a second console cannot listen there: it says so, exit 1
        second = ui_process_exits(tmp_path, "--db", str(journal.db))
        assert second == (1, "loomflow ui: cannot listen on 127.0.0.1:8765: Address already in use")


def ui_process_exits(tmp_path: Path, *args: str) -> tuple[int, str]:
    import subprocess

    done = subprocess.run(
        ["loomflow", "ui", *args], env=user_env(), capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stderr.strip()


@pytest.mark.parametrize("where", ["0.0.0.0", "own address"])
def test_beyond_the_loopback_it_asks_for_a_token_the_login_link_sets_once(
    journal: Journal, tmp_path: Path, where: str
) -> None:
    assert journal.db is not None
    host = own_address() if where == "own address" else "0.0.0.0"
    with ui_process(tmp_path, "--db", str(journal.db), "--host", host, "--port", "0") as ui:
        port = urlsplit(ui.url).port
        assert port and ui.login is not None, ui.stderr()
        made = re.search(r"the token, made for this run .*: (\S+)$", ui.stderr(), re.M)
        assert made is not None, ui.stderr()
        base = f"http://{own_address()}:{port}"
        assert urlsplit(ui.url).hostname == (host if host != "0.0.0.0" else socket.gethostname())
        for path in ("/", "/api/sessions", "/static/console.js", f"/sessions/{journal.hostile}"):
            answer = httpx.get(f"{base}{path}")
            assert answer.status_code == 401, (path, answer.text)
            assert "needs its token" in answer.text
        # the token it printed is a tool's bearer token
        bearer = {"Authorization": f"Bearer {made.group(1)}"}
        assert httpx.get(f"{base}/api/sessions", headers=bearer).status_code == 200
        login = urlsplit(ui.login)
        link = f"{base}{login.path}?{login.query}"
        with httpx.Client(follow_redirects=True) as browser:
            signed = browser.get(link)  # follows the redirect to the list, with the cookie
            assert signed.status_code == 200 and journal.alice[0] in signed.text
            assert browser.get(f"{base}/api/sessions").status_code == 200
        with httpx.Client() as another:
            again = another.get(link)
            assert again.status_code == 401 and "used already" in again.text
            assert another.get(f"{base}/").status_code == 401


def test_the_token_of_loomflow_ui_token_is_the_bearer_token(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    env = user_env(LOOMFLOW_UI_TOKEN=TOKEN, LOOMFLOW_UI_HOST="0.0.0.0", LOOMFLOW_UI_PORT="0")
    with ui_process(tmp_path, "--db", str(journal.db), env=env) as ui:
        assert TOKEN not in ui.stderr()  # never printed, nor put in the link
        assert "made for this run" not in ui.stderr()
        base = f"http://127.0.0.1:{urlsplit(ui.url).port}"
        assert httpx.get(f"{base}/api/sessions").status_code == 401
        wrong = httpx.get(f"{base}/api/sessions", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = httpx.get(f"{base}/api/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200 and right.json()["total_sessions"] == journal.count
        # beyond the loopback any Host is answered (the token is the check)
        named = httpx.get(
            f"{base}/api/csrf", headers={"Authorization": f"Bearer {TOKEN}", "Host": "box:1"}
        )
        assert named.status_code == 200


def test_a_users_console_as_a_process_shows_that_users_sessions_only(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    with ui_process(tmp_path, "--db", str(journal.db), "--user", "alice", "--port", "0") as ui:
        listing = httpx.get(f"{ui.url}api/sessions", params={"limit": 500}).json()
        assert {r["user_id"] for r in listing["sessions"]} == {"alice"}
        assert httpx.get(f"{ui.url}sessions/{journal.bob[0]}?user=bob").status_code == 404
        assert "user alice" in httpx.get(ui.url).text


def test_ctrl_c_ends_it_with_a_live_stream_open(journal: Journal, tmp_path: Path) -> None:
    assert journal.db is not None
    db = tmp_path / "journal.db"
    shutil.copy(journal.db, db)
    with ui_process(tmp_path, "--db", str(db), "--port", "0") as ui:
        parts = urlsplit(ui.url)
        conn = http.client.HTTPConnection(parts.netloc, timeout=60)
        conn.request("GET", f"/live/sessions/{journal.alice[0]}?user=alice")
        stream = conn.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b"event: ")
        ui.proc.send_signal(signal.SIGINT)
        assert ui.proc.wait(timeout=30) == 0, ui.stderr()
        conn.close()
        assert "Traceback" not in ui.stderr()
