"""``loomflow keys``: the Ed25519 keys that sign events and audit digests, and the keyring
of public keys their readers trust (:mod:`loomflow.schemas.signing`).

``new`` makes a key: its private half goes to a file of its own (mode 0600, never
overwritten), its public half into the keyring. ``public`` prints a key file's public
half, the line ``add`` puts into a keyring on another machine (an auditor's), so a
private key never leaves the machine it was made on. ``retire`` ends a key's validity
from a moment on; ``list`` shows the keyring. The keyring is ``--keyring``, else
``LOOMFLOW_KEYRING``; each change rewrites it whole and replaces the file at once.

Only ``list``'s table loads rich.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from loomflow.cli.options import parse_when
from loomflow.control.refused import Refused
from loomflow.errors import SigningKeyError
from loomflow.schemas.clock import utcnow
from loomflow.schemas.signing import ROLES, Keyring, Role, TrustedKey

__all__ = ["NAMES", "add_parser"]

NAMES = ("keys",)

#: what the refusal of a keyring that reads but does not decode adds: what to do about it
_FIX = "restore the file from a copy or mend it by hand (`loomflow keys` writes it)"

#: what a public key given as text is made of (its base64url, a key id); anything else
#: (a dot, a slash) names a file
_TEXT = re.compile(r"[\w:\s-]+")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keys`` (new, add, public, retire, list)."""
    keyring = argparse.ArgumentParser(add_help=False)
    keyring.add_argument(
        "--keyring",
        type=Path,
        metavar="FILE",
        help="the keyring: a JSON file of public keys (default: LOOMFLOW_KEYRING)",
    )
    role = argparse.ArgumentParser(add_help=False)
    role.add_argument(
        "--role",
        choices=ROLES,
        default="events",
        help="what the key may sign: events (a writer's: agents, workers, the lifecycle "
        "verbs) or digests (the audit's); default: %(default)s",
    )
    keys = commands.add_parser(
        "keys",
        help="make, trust, retire and list the keys that sign events and audit digests",
        description="Ed25519 signing keys: a private key file for each writer and for the "
        "audit, and the keyring of public keys their readers trust (LOOMFLOW_KEYRING). "
        "Exit codes: 0 done, 1 a file that cannot be read or written, or is malformed, a "
        "key unknown or retired already, 2 a usage error.",
    )
    verbs = keys.add_subparsers(dest="verb", required=True, metavar="{new,add,public,retire,list}")
    new = verbs.add_parser(
        "new",
        parents=[keyring, role],
        help="make a key: its private half to KEYFILE, its public half into the keyring",
        description="Generate an Ed25519 key, write its private half to KEYFILE (a new "
        "file, mode 0600: an existing file is never overwritten) and trust its public half "
        "in the keyring for --role, creating the keyring if missing. Print its key id "
        "alone, for ID=$(loomflow keys new ...). Give KEYFILE to the processes that sign "
        "(LOOMFLOW_SIGNING_KEY_FILE), and keep it secret.",
    )
    new.add_argument("key_file", type=Path, metavar="KEYFILE", help="where to write the key")
    _json_option(new, "key_id, key_file, keyring, roles")
    new.set_defaults(handler=_handler("keys new", _new))
    add = verbs.add_parser(
        "add",
        parents=[keyring, role],
        help="trust a public key made elsewhere (what `keys public` printed)",
        description="Trust the public key PUBLIC in the keyring for --role, creating the "
        "keyring if missing: a key made on another machine, whose private half stays "
        "there. PUBLIC is a file holding the line `loomflow keys public` printed (its key "
        "id is checked against the key), or that line or the key alone (base64url) as "
        "text. Print its key id: compare it with the one its owner sent.",
    )
    add.add_argument("public", metavar="PUBLIC", help="a file, or the public key as text")
    _json_option(add, "key_id, keyring, roles")
    add.set_defaults(handler=_handler("keys add", _add))
    public = verbs.add_parser(
        "public",
        help="print a key file's public half, for `keys add` on another machine",
        description="Print the public half of the private key in KEYFILE as one line: its "
        "key id and the key in base64url. Send that line (or `> writer.pub`) to whoever "
        "keeps a keyring; `loomflow keys add` takes it. Nothing secret is printed.",
    )
    public.add_argument(
        "key_file", type=Path, metavar="KEYFILE", help="a private key file of `keys new`"
    )
    _json_option(public, "key_id, public (the key in base64url)")
    public.set_defaults(handler=_handler("keys public", _public))
    retire = verbs.add_parser(
        "retire",
        parents=[keyring],
        help="end a key's validity from now (or --at)",
        description="Retire KEYID in the keyring: its signatures then hold only on what "
        "is dated at or before the moment of retirement (now, or --at). Rotate a key by "
        "making a new one, giving it to the processes that signed with the old one, then "
        "retiring the old one.",
    )
    retire.add_argument("key_id", metavar="KEYID", help="a key id, as `loomflow keys list` lists")
    retire.add_argument(
        "--at",
        type=parse_when,
        metavar="WHEN",
        help="retire it from WHEN, not now: an ISO datetime (UTC unless it names a zone) or "
        "an age (2h: two hours ago); not in the future. What it signed after WHEN is then "
        "refused by every reader, and a retirement is not moved: asked first at a "
        "terminal, else refused without --yes",
    )
    retire.add_argument(
        "--yes", action="store_true", help="retire it from a moment past without asking"
    )
    _json_option(retire, "key_id, keyring, retired_at")
    retire.set_defaults(handler=_handler("keys retire", _retire))
    ls = verbs.add_parser(
        "list",
        parents=[keyring],
        help="the keys of the keyring: id, roles, added, retired",
        description="One row per key of the keyring: its id, roles, when it was added and "
        "when it was retired.",
    )
    _json_option(ls, "key_id, roles, added_at, retired_at, public", each="per key, a line each")
    ls.add_argument(
        "--wide", action="store_true", help="every cell whole, however wide the terminal"
    )
    ls.set_defaults(handler=_handler("keys list", _list))


def _json_option(parser: argparse.ArgumentParser, fields: str, each: str = "") -> None:
    """``--json``, its help naming the fields (those of ``new`` and ``list`` are in the
    README too)."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"one JSON object{' ' + each if each else ''}; fields: {fields}",
    )


def _handler(name: str, action: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """``action``, its refusals and unreadable or malformed files one line on stderr."""

    def handle(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except Refused as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return exc.code
        except SigningKeyError as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return 1

    return handle


# -- the keyring -----------------------------------------------------------------------


def _keyring_path(args: argparse.Namespace) -> Path:
    """``--keyring``, else ``LOOMFLOW_KEYRING``; else Refused, naming both."""
    if args.keyring is not None:
        return Path(args.keyring)
    from loomflow.control.source import read_settings

    settings = read_settings()
    if settings is None:
        raise Refused("fix the LOOMFLOW_* variable named above", 2)
    if settings.keyring is None:
        raise Refused("which keyring? name it with --keyring FILE, or set LOOMFLOW_KEYRING", 2)
    return settings.keyring


def _load(path: Path, *, missing_ok: bool = False) -> Keyring:
    """The keyring at ``path``; an empty one if it is missing and ``missing_ok``."""
    if not path.exists():
        if missing_ok:
            return Keyring({})
        raise SigningKeyError(
            f"no keyring at {path}: `loomflow keys new KEYFILE --keyring {path}` (or `keys "
            "add`) makes one"
        )
    try:
        path.read_bytes()
    except OSError as exc:  # not a keyring to mend: say only why it does not read
        raise SigningKeyError(f"cannot read the keyring {path}: {exc.strerror or exc}") from None
    try:
        return Keyring.load(path)
    except SigningKeyError as exc:
        raise SigningKeyError(f"{exc}; {_FIX}") from None


def _save(keyring: Keyring, path: Path) -> None:
    try:
        keyring.save(path)
    except OSError as exc:
        raise SigningKeyError(f"cannot write the keyring {path}: {exc.strerror or exc}") from None


def _trust(args: argparse.Namespace, key: TrustedKey) -> tuple[Path, Keyring]:
    """The keyring of ``args`` with ``key`` added (not saved yet)."""
    path = _keyring_path(args)
    keyring = _load(path, missing_ok=True)
    if key.key_id in keyring.keys:
        raise SigningKeyError(f"{path} holds {key.key_id} already; nothing changed")
    return path, keyring.with_key(key)


def _key_json(key: TrustedKey) -> dict[str, Any]:
    """A key as ``keys list --json`` prints it (a line each)."""
    from loomflow.cli.render import iso

    return {
        "key_id": key.key_id,
        "roles": list(key.roles),
        "added_at": iso(key.added_at),
        "retired_at": iso(key.retired_at),
        "public": key.to_json()["public"],
    }


# -- the commands ----------------------------------------------------------------------


def _new(args: argparse.Namespace) -> int:
    from loomflow.cli.render import print_json
    from loomflow.schemas.signing import Signer

    key_file: Path = args.key_file
    roles: tuple[Role, ...] = (args.role,)
    signer = Signer.generate()
    path, keyring = _trust(args, signer.trusted(roles))
    if key_file.resolve() == path.resolve():
        raise Refused(f"{key_file} is the keyring: give the key a file of its own", 2)
    try:
        signer.write(key_file)  # refused if it exists: a key file is never overwritten
    except SigningKeyError as exc:
        raise SigningKeyError(f"{exc}; name a new file") from None
    except OSError as exc:
        raise SigningKeyError(
            f"cannot write the key file {key_file}: {exc.strerror or exc}"
        ) from None
    try:
        _save(keyring, path)
    except SigningKeyError:
        key_file.unlink()  # ours, written just now: no key the keyring does not know
        raise
    if args.json:
        print_json(
            {
                "key_id": signer.key_id,
                "key_file": str(key_file),
                "keyring": str(path),
                "roles": list(roles),
            }
        )
        return 0
    print(signer.key_id)  # alone on stdout, for ID=$(loomflow keys new ...)
    print(
        f"wrote the private key to {key_file} (mode 0600: keep it secret); {path} trusts "
        f"it to sign {args.role}",
        file=sys.stderr,
    )
    return 0


def _add(args: argparse.Namespace) -> int:
    from loomflow.cli.render import print_json
    from loomflow.schemas.signing import key_id_of, public_from_text

    given = Path(args.public)
    if given.is_file():
        try:
            text = given.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SigningKeyError(f"cannot read the public key file {given}: {exc}") from None
        public = public_from_text(text, str(given))
    elif not (_TEXT.fullmatch(args.public) or args.public.startswith("-----BEGIN")):
        raise SigningKeyError(f"no file {given}: give the file `loomflow keys public` wrote")
    else:
        public = public_from_text(args.public, "the PUBLIC argument")
    roles: tuple[Role, ...] = (args.role,)
    key = TrustedKey(key_id_of(public), public, utcnow(), None, roles)
    path, keyring = _trust(args, key)
    _save(keyring, path)
    if args.json:
        print_json({"key_id": key.key_id, "keyring": str(path), "roles": list(roles)})
        return 0
    print(key.key_id)
    print(f"{path} trusts it to sign {args.role}", file=sys.stderr)
    return 0


def _public(args: argparse.Namespace) -> int:
    from loomflow.cli.render import print_json
    from loomflow.schemas.signing import Signer, public_text

    signer = Signer.from_file(args.key_file)
    line = public_text(signer.public)
    if args.json:
        print_json({"key_id": signer.key_id, "public": line.split()[1]})
    else:
        print(line)
    return 0


def _retire(args: argparse.Namespace) -> int:
    from loomflow.cli.render import iso, print_json, timestamp

    now = utcnow()
    at: datetime = now if args.at is None else args.at
    if at > now:
        raise Refused(
            f"--at {timestamp(at)} is in the future: a key is retired from now or from a "
            "moment past",
            2,
        )
    path = _keyring_path(args)
    keyring = _load(path)
    key = keyring.keys.get(args.key_id)
    if key is None:
        raise SigningKeyError(
            f"{path} holds no key {args.key_id}: `loomflow keys list --keyring {path}` "
            "lists its keys"
        )
    if key.retired_at is not None:
        raise SigningKeyError(
            f"{args.key_id} was retired at {timestamp(key.retired_at)} already; a "
            "retirement is not moved"
        )
    if now - at > _PAST and not args.yes and not _agreed(args.key_id, timestamp(at)):
        raise Refused(
            f"would retire {args.key_id} from {timestamp(at)}, a moment past: what it "
            "signed after then would be refused by every reader, and a retirement is not "
            "moved; pass --yes to do it without asking",
            2,
        )
    _save(keyring.retire(args.key_id, at), path)
    if args.json:
        print_json({"key_id": args.key_id, "keyring": str(path), "retired_at": iso(at)})
        return 0
    print(
        f"retired {args.key_id} at {timestamp(at)}: its signatures hold on what is dated up to then"
    )
    return 0


#: how far back ``retire --at`` goes without asking: a moment ago is now
_PAST = timedelta(minutes=1)


def _agreed(key_id: str, at: str) -> bool:
    """A person's yes at a terminal to retiring ``key_id`` from ``at``, a moment past
    (False without a terminal)."""
    if not sys.stdin.isatty():
        return False
    answer = input(
        f"Retire {key_id} from {at}? What it signed after then will be refused by every "
        "reader, and a retirement is not moved. [y/N] "
    )
    return answer.strip().lower() in ("y", "yes")


def _list(args: argparse.Namespace) -> int:
    from loomflow.cli.render import (
        Cell,
        Column,
        Fitted,
        compact_time,
        console,
        print_json,
        timestamp,
    )

    path = _keyring_path(args)
    keyring = _load(path)
    keys = sorted(keyring.keys.values(), key=lambda key: (key.added_at, key.key_id))
    if args.json:
        for key in keys:
            print_json(_key_json(key))
        return 0
    out = console(wide=args.wide)
    if not keys:
        out.print(f"no keys in {path}", markup=False, highlight=False)
        return 0
    columns = [Column("key id"), Column("roles"), Column("added"), Column("retired")]
    rows: list[list[str | Cell]] = [
        [
            key.key_id,
            ",".join(key.roles),
            Cell(timestamp(key.added_at), compact_time(key.added_at)),
            "-"
            if key.retired_at is None
            else Cell(timestamp(key.retired_at), compact_time(key.retired_at)),
        ]
        for key in keys
    ]
    out.print(Fitted(columns, rows))
    return 0
