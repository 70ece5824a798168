"""
``haystack-state store``: put, get, search, delete and list namespaces of a store on a SQLite file and on
PostgreSQL, in text and ``--json``; bad input is one line on stderr, exit code 1, and the store as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from persistence.harness import postgres_dsn, postgres_schema

from haystack_state.cli import main

__all__ = ["postgres_dsn", "postgres_schema"]  # fixtures


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "sqlite":
        return ["--db", str(tmp_path / "memory.db")]
    return ["--db", request.getfixturevalue("postgres_dsn"), "--schema", request.getfixturevalue("postgres_schema")]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_put_get_search_namespaces_delete(capsys: pytest.CaptureFixture[str], db: list[str]) -> None:
    code, out, _ = run(capsys, "store", "put", "users.u1.memories", "m1", '{"text": "likes green tea", "n": 1}', *db)
    assert code == 0 and out.startswith("put users.u1.memories  m1  ")
    run(capsys, "store", "put", "users.u1.memories", "m2", '{"text": "allergic to nuts", "n": 2}', *db)
    run(capsys, "store", "put", "users.u2.memories", "m1", '{"text": "likes tea too", "n": 3}', *db)

    code, out, _ = run(capsys, "store", "get", "users.u1.memories", "m1", "--json", *db)
    item = json.loads(out)
    assert code == 0 and item["namespace"] == ["users", "u1", "memories"] and item["value"]["text"] == "likes green tea"

    code, out, _ = run(capsys, "store", "search", "users.u1", "--query", "tea", *db)
    assert code == 0 and len(out.splitlines()) == 1 and "likes green tea" in out and "score=" in out
    code, out, _ = run(capsys, "--json", "store", "search", "--filter", '{"n": {"$gte": 2}}', *db)
    assert sorted(i["value"]["n"] for i in json.loads(out)) == [2, 3]

    code, out, _ = run(capsys, "store", "namespaces", *db)
    assert out.splitlines() == ["users.u1.memories", "users.u2.memories"]
    code, out, _ = run(capsys, "store", "namespaces", "--max-depth", "2", "--json", *db)
    assert json.loads(out) == [["users", "u1"], ["users", "u2"]]

    code, out, _ = run(capsys, "store", "delete", "users.u1.memories", "m1", *db)
    assert code == 0 and out == "deleted users.u1.memories  m1\n"
    code, out, err = run(capsys, "store", "get", "users.u1.memories", "m1", *db)
    assert (
        code == 1
        and out == ""
        and err.strip() == ("haystack-state: error: No item with key 'm1' in namespace ('users', 'u1', 'memories').")
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["put", "users..x", "k", "{}"], "label 1 ('') is empty"),
        (["put", "users", "k", "[1, 2]"], "VALUE must be a JSON object"),
        (["put", "users", "k", "{oops"], "VALUE is not valid JSON"),
        (["put", "users", "k", "{}", "--ttl", "-5"], "must be a positive number of seconds"),
        (["search", "--filter", '{"n": {"$regex": "x"}}'], "unknown operator '$regex'"),
        (["delete", "users", "missing"], "No item with key 'missing'"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], db: list[str], args: list[str], message: str
) -> None:
    run(capsys, "store", "put", "users", "kept", '{"v": 1}', *db)
    code, out, err = run(capsys, "store", *args, *db)
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and message in err
    code, out, _ = run(capsys, "store", "search", "--json", *db)
    assert [(i["key"], i["value"]) for i in json.loads(out)] == [("kept", {"v": 1})]


def test_read_commands_do_not_create_a_sqlite_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    code, _, err = run(capsys, "store", "namespaces", "--db", str(path))
    assert code == 1 and err == f"haystack-state: error: {path} does not exist\n" and not path.exists()


def test_the_db_option_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "store", "get", "users", "k")
    assert code == 2 and "--db" in err
