"""Dataset rows from a local JSONL/JSON/CSV/parquet file or, when reachable, the HF hub.

Rows keep the dataset's published field names; the task modules (gsm8k.py, gpqa.py)
interpret them. Every failure is a `DataError` with one line that says how to fix it.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse


class DataError(ValueError):
    """A dataset could not be read; the message is one line and names the fix."""


@dataclass(frozen=True)
class HubSource:
    repo: str
    config: str
    splits: tuple[str, ...]   # eval split first, then the shot split if any
    fields: str               # the published field names, for the error message


def sibling(where: str, field: str) -> str:
    """How the user names another field of the same task, given how they named its data file: a recipe
    path (accuracy.tasks.0.data -> accuracy.tasks.0.num_shots) or a `pipeline eval` flag (--data ->
    --num-shots). Errors name what the user can actually set."""
    if where.startswith("--"):
        return "--" + field.replace("_", "-")
    return where.rsplit(".", 1)[0] + "." + field if "." in where else field


def read_rows(path: Path, where: str) -> list[dict]:
    """All rows of a local .jsonl/.json/.csv/.parquet file, as dicts. A .json file holds a JSON array of
    objects or JSON Lines. CSV is GPQA's published format (gpqa_diamond.csv: Question, Correct Answer,
    Incorrect Answer 1..3, Record ID, ...)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{where}: file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path.read_text(), path, where)
    if suffix == ".json":
        return _read_json(path, where)
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    if suffix == ".csv":
        return _read_csv(path, where)
    raise DataError(f"{where}: unsupported file type '{suffix}' ({path}); use .jsonl, .json, .csv or .parquet")


def _read_csv(path: Path, where: str) -> list[dict]:
    import pandas as pd

    try:
        # Everything as text, empty cells as "": an answer like "1e5" or "NA" must reach the prompt verbatim.
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        reason = " ".join(str(e).split())[:200]
        raise DataError(f"{where}: {path} is not a readable CSV ({type(e).__name__}: {reason})") from None
    return df.to_dict("records")


_JSON_ACCEPTED = "a .json file holds one JSON array of objects, or one JSON object per line (JSON Lines)"


def _read_json(path: Path, where: str) -> list[dict]:
    """A JSON array of objects (json.dump of a list of rows, pandas' orient='records'), or JSON Lines under a
    .json name, which the `datasets` library's to_json writes and which this reader has always taken."""
    text = path.read_text()
    if not text.lstrip().startswith("["):
        return _read_jsonl(text, path, where, hint=f"; {_JSON_ACCEPTED}")
    try:
        rows = json.loads(text)  # an array may spread over many lines: parse it whole
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: {path}:{e.lineno} is not valid JSON ({e.msg}); {_JSON_ACCEPTED}") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{where}: {path}: item {i} of the array is {json.dumps(row)[:60]}, "
                            f"not an object; {_JSON_ACCEPTED}")
    return rows


def _read_jsonl(text: str, path: Path, where: str, hint: str = "") -> list[dict]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: {path}:{lineno} is not valid JSON ({e.msg}){hint}") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: {path}:{lineno} is a {type(row).__name__}, "
                            f"expected a JSON object per line{hint}")
        rows.append(row)
    return rows


def require_fields(rows: list[dict], fields: tuple[str, ...], where: str, path: object) -> None:
    for i, row in enumerate(rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise DataError(f"{where}: row {i} of {path} lacks field(s) {missing}; "
                            f"expected the published names {list(fields)}")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Cheap TCP probe of the hub, so offline runs fail in seconds, not after
    `datasets`' own retries (~25 s per file)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _hub_offline_mode() -> bool:
    # With these set, `datasets` serves a cached copy without touching the network.
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def load_hub(source: HubSource, where: str) -> list[list[dict]]:
    """Rows of each split in `source.splits`, or one DataError saying how to provide a file."""
    fix = f"set {where} to a local file with fields {source.fields}"
    if not _hub_offline_mode() and not hub_reachable():
        raise DataError(f"{where}: no local data file and the HF hub is unreachable "
                        f"(dataset {source.repo}/{source.config}); {fix} "
                        "(or set HF_HUB_OFFLINE=1 to use a cached copy)")
    try:
        import datasets

        return [datasets.load_dataset(source.repo, source.config, split=s).to_list()
                for s in source.splits]
    except Exception as e:  # noqa: BLE001 - gated repo, offline cache miss, bad config...
        reason = " ".join(str(e).split())[:200]
        raise DataError(f"{where}: could not load {source.repo}/{source.config} from the HF hub "
                        f"({type(e).__name__}: {reason}); {fix}") from None


def row_id(row: dict, index: int) -> str:
    """A stable question id: the file's own id if it has one, else the row index."""
    for key in ("id", "Record ID"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    return str(index)
