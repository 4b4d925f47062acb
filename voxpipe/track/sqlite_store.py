"""The local sqlite MLflow store (no server: `work/mlflow.db`) made whole or not at all.

MLflow creates a new store by running its alembic migrations one by one on the file. A full disk (or a
kill) in the middle leaves a half-migrated database, typically with a `_alembic_tmp_<table>` left by a
batch migration, and every later open then fails in alembic ("table _alembic_tmp_endpoints already
exists") with nothing saying what to do. So a new store is migrated under a temporary name beside the
final one and renamed into place once complete; if that fails, the temporary file is removed and the
error is one paragraph. A half-migrated store made before this (or by another tool) is detected before
MLflow touches it and named with the way out.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path

from voxpipe.errors import StepError

_LEFT_BY_MIGRATION = "_alembic_tmp_"


def ready_sqlite_store(db: Path) -> None:
    """Make sure `db` is a whole MLflow store: create it if absent; refuse a half-migrated one.

    Call with the store's creation lock held (two processes must not create it at once)."""
    if db.exists():
        check_whole(db)
    else:
        create(db)


def check_whole(db: Path) -> None:
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            names = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError as e:
        raise StepError(f"MLflow store {db}: not a readable sqlite database ({e}). Move it aside "
                        f"(mv {db} {db}.broken) and rerun to start a new store, or restore it from a "
                        "backup") from None
    left = sorted(n for n in names if n.startswith(_LEFT_BY_MIGRATION))
    if left:
        raise StepError(
            f"MLflow store {db} is half-migrated: table {left[0]} was left by a migration that stopped "
            "midway (a full disk, or a killed process, while the store was being created or upgraded), and "
            f"MLflow cannot open it. If it holds no runs you need (a store that never finished being "
            f"created does not), move it aside and rerun: mv {db} {db}.broken. Otherwise restore it from a "
            "backup and free space before the next run"
        )


def create(db: Path) -> None:
    """Migrate a new store as `.<name>.creating-<random>` beside `db`, then rename it in (atomic on one
    volume). The name is new for every attempt: MLflow's stores keep one engine per URI for the process,
    and an engine of a failed attempt still holds the removed file's half-made tables."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for stale in db.parent.glob(f".{db.name}.creating-*"):  # a killed attempt's (the caller holds the lock)
        stale.unlink(missing_ok=True)
    tmp = db.with_name(f".{db.name}.creating-{secrets.token_hex(4)}")
    uri = f"sqlite:///{tmp}"
    try:
        SqlAlchemyStore(uri, (db.parent / "mlruns").as_uri())  # creates and migrates every table
        RegistryStore(uri)  # checks the registry's tables on the same database
        _release(uri, SqlAlchemyStore, RegistryStore)
        os.replace(tmp, db)
    except Exception as e:
        _release(uri, SqlAlchemyStore, RegistryStore)
        _remove(tmp)
        reason = " ".join(str(getattr(e, "orig", None) or e).split())[:300]
        raise StepError(
            f"creating the MLflow store {db} failed ({reason}). The half-made store was removed, so "
            f"nothing is left there to trip a rerun. Free space on that volume (or make {db.parent} "
            "writable, or set tracking.uri to an MLflow server) and rerun"
        ) from e


def _release(uri: str, *stores: type) -> None:
    """Close the engines MLflow cached for the temporary URI (it is never opened again)."""
    for store in stores:
        engine = getattr(store, "_engine_map", {}).pop(uri, None)
        if engine is not None:
            engine.dispose()


def _remove(db: Path) -> None:
    for path in (db, db.with_name(f"{db.name}-journal"), db.with_name(f"{db.name}-wal"),
                 db.with_name(f"{db.name}-shm")):
        path.unlink(missing_ok=True)
