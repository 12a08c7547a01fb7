"""``dpgov witness``: follow a log, check its consistency, cosign its checkpoint (cron-able).

``run`` (pull, from cron) fetches the log's newest checkpoint, checks it against the witness's
state file (the largest checkpoint it cosigned) with a consistency proof, and prints the
cosigned note; a fork or rollback exits 1 naming it, and the state does not move. ``serve``
answers the C2SP ``tlog-witness`` ``add-checkpoint`` protocol (logs push). ``key`` makes a key.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.common import path_option, refuse

if TYPE_CHECKING:
    from dp_governor.mechanisms.signed_note import Signer

app = typer.Typer(help="Witness a transparency log: check consistency, cosign checkpoints.")


@app.command("key")
def witness_key(
    name: Annotated[str, typer.Option(help="The witness's name (a schema-less URL).")],
    key_file: Annotated[Path, path_option(help="Where to write the private key (0600).")],
) -> None:
    """Create a witness key and print its verifier key (give that to the clients)."""
    from dp_governor.mechanisms.signed_note import COSIGNATURE, NoteError, Signer

    if key_file.exists():
        refuse(f"{key_file} exists: a witness key is never overwritten")
    seed = secrets.token_bytes(32)
    try:
        signer = Signer(name, seed, kind=COSIGNATURE)
    except NoteError as exc:
        refuse(f"--name: {exc}")
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(seed.hex() + "\n")
    typer.echo(signer.verifier.vkey())


def _signer(name: str, key_file: Path) -> Signer:
    """The witness's cosigning key from its key file (refused with a message if unreadable)."""
    from dp_governor.mechanisms.signed_note import COSIGNATURE, Signer

    try:
        seed = bytes.fromhex(key_file.read_text(encoding="ascii").strip())
        return Signer(name, seed, kind=COSIGNATURE)
    except (OSError, ValueError) as exc:
        refuse(f"--key-file: {key_file}: {exc}")


@app.command("serve")
def witness_serve(
    log_key: Annotated[
        list[str], typer.Option(help="A log's verifier key (vkey); repeat for several logs.")
    ],
    name: Annotated[str, typer.Option(help="The witness's name.")],
    key_file: Annotated[Path, path_option(help="The witness key (`dpgov witness key`).")],
    state_db: Annotated[Path, path_option(help="The witness's state (SQLite, created).")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one).")] = 8100,
) -> None:
    """Answer C2SP tlog-witness `POST /add-checkpoint` for the given logs until stopped."""
    import logging

    from dp_governor.api.witness_service import Witness, WitnessStore, make_server
    from dp_governor.mechanisms.signed_note import NoteError, Verifier

    logs = []
    for vkey in log_key:
        try:
            logs.append(Verifier.parse(vkey))
        except NoteError as exc:
            refuse(f"--log-key: {exc}")
    names = [log.name for log in logs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a checkpoint names its log by origin: one key would silently replace the other
        refuse(
            f"--log-key: two keys name the log {twice[0]!r}; a witness follows one log of a"
            " name (run one witness per log of that name)"
        )
    signer = _signer(name, key_file)
    try:
        store = WitnessStore(state_db)
    except Exception as exc:  # sqlite3.Error and OSError alike: name the file
        refuse(f"--state-db: {state_db}: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        server = make_server(Witness(signer, logs, store), host, port)
    except OSError as exc:
        refuse(f"--port: cannot listen on {host}:{port}: {exc}", code=1)
    bound = server.server_address[1]
    typer.echo(f"witness {name} listening on http://{host}:{bound}", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command("run")
def witness_run(
    log_url: Annotated[str, typer.Option(help="The service's base URL.")],
    log_key: Annotated[str, typer.Option(help="The log's verifier key (vkey), from its operator.")],
    name: Annotated[str, typer.Option(help="The witness's name.")],
    key_file: Annotated[Path, path_option(help="The witness key (`dpgov witness key`).")],
    state_file: Annotated[Path, path_option(help="The witness's state (created if missing).")],
    output: Annotated[
        Path | None, path_option(help="Write the cosigned checkpoint here (default: stdout).")
    ] = None,
) -> None:
    """Fetch, check and cosign the log's newest checkpoint."""
    import httpx

    from dp_governor.api.client.witness import Fork, WitnessState, cosign_checkpoint
    from dp_governor.mechanisms.merkle import decode_hashes
    from dp_governor.mechanisms.signed_note import NoteError, Verifier

    try:
        log = Verifier.parse(log_key)
    except NoteError as exc:
        refuse(f"--log-key: {exc}")
    signer = _signer(name, key_file)
    try:
        state = (
            WitnessState.from_json(state_file.read_bytes())
            if state_file.exists()
            else WitnessState(log.name)
        )
    except (OSError, ValueError) as exc:
        refuse(f"--state-file: {exc}")
    base = log_url.rstrip("/")
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            answer = http.get("/v1/tlog/checkpoint")
            answer.raise_for_status()
            note = answer.json()["note"]
            if note is None:
                refuse("the log has signed no checkpoint yet", code=1)

            def proof(old: int, new: int) -> list[bytes]:
                got = http.get("/v1/tlog/consistency", params={"old": old, "new": new})
                got.raise_for_status()
                try:
                    return decode_hashes(got.json()["proof"])
                except ValueError as exc:
                    refuse(f"refused: the log's consistency proof: {exc}", code=1)

            cosigned, new_state = cosign_checkpoint(
                note, log, state, proof, signer, now=int(time.time())
            )
    except httpx.HTTPError as exc:
        refuse(f"--log-url: {base}: {exc}", code=1)
    except Fork as exc:
        refuse(f"refused: {exc}", code=1)
    except NoteError as exc:
        refuse(f"refused: {exc}", code=1)
    tmp = state_file.with_name(state_file.name + ".tmp")
    tmp.write_bytes(new_state.to_json())
    tmp.replace(state_file)
    if output is None:
        typer.echo(cosigned, nl=False)
    else:
        output.write_text(cosigned, encoding="utf-8")
