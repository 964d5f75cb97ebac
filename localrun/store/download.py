"""Downloading one file from the Hugging Face Hub into the model store: resumable, verified, atomic.

``huggingface_hub.get_hf_file_metadata`` (HEAD …/resolve/REV/FILE) gives the size (``X-Linked-Size``), the
commit and the LFS sha256 (``X-Linked-Etag``); the body is streamed with the hub's own HTTP session into
``<file>.partial`` and hashed as it arrives; a later call hashes the bytes already there and asks for the
rest (``Range: bytes=N-``). Only a file whose size and sha256 both match is renamed onto ``<file>``, so a
broken download never replaces a good one. Free disk space is checked before the first byte. The store
keeps its own layout (``<models_dir>/<name>/<file>`` + a ``.localrun.json`` sidecar), which is why this
streams through the hub's session rather than ``hf_hub_download``'s cache layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from localrun.errors import DownloadError
from localrun.model.catalog import quant_from_filename

DEFAULT_ENDPOINT = "https://huggingface.co"
SIDECAR_SUFFIX = ".localrun.json"
PARTIAL_SUFFIX = ".partial"
CHUNK_BYTES = 1 << 20

def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def hub_errors(repo: str, what: str):
    """Context manager turning huggingface_hub / network exceptions into LocalrunErrors with a hint:
    ModelNotFoundError (exit 2) for a repository or file that does not exist, DownloadError (exit 10) for
    access, network and other hub failures."""
    from contextlib import contextmanager

    @contextmanager
    def cm():
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
        try:
            yield
        except GatedRepoError:
            has = "your HF_TOKEN has no access" if hub_token() else "no HF_TOKEN is set"
            raise DownloadError(
                f"{repo} is a gated repository and {has}",
                hint=f"accept its license at https://huggingface.co/{repo}, create a read token at "
                "https://huggingface.co/settings/tokens and run `export HF_TOKEN=hf_...`") from None
        except RemoteEntryNotFoundError:
            from localrun.errors import ModelNotFoundError

            raise ModelNotFoundError(repo, message=f"{what} does not exist in {repo}",
                                     hint=f"see the files at https://huggingface.co/{repo}/tree/main") from None
        except RevisionNotFoundError:
            raise DownloadError(f"{what}: revision not found in {repo}") from None
        except RepositoryNotFoundError:  # a name that resolves to nothing: exit 2, like an unknown catalog name
            from localrun.errors import ModelNotFoundError

            raise ModelNotFoundError(repo, message=f"repository {repo} not found on the hub (or private)",
                                     hint="check the name; for a private repo set HF_TOKEN") from None
        except HfHubHTTPError as e:
            raise DownloadError(f"the hub refused {what}: {str(e).strip().splitlines()[0]}") from None
        except OSError as e:
            raise DownloadError(f"cannot reach {hub_endpoint()} for {what}: {e}",
                                hint="check the network (or HF_ENDPOINT); run the same pull again to resume") from None
        except Exception as e:  # httpx2 transport errors are not OSError
            if type(e).__module__.startswith(("httpx", "httpcore")):
                raise DownloadError(f"cannot reach {hub_endpoint()} for {what}: {e}",
                                    hint="check the network (or HF_ENDPOINT); run the same pull again to "
                                    "resume") from None
            raise

    return cm()


# --- the download -----------------------------------------------------------------------------

def free_disk_bytes(path: Path) -> int:
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def _file_url(repo: str, file: str, revision: str) -> str:
    return f"{hub_endpoint()}/{repo}/resolve/{quote(revision, safe='')}/{quote(file)}"


def read_sidecar(path: Path) -> dict | None:
    side = path.with_name(path.name + SIDECAR_SUFFIX)
    try:
        return json.loads(side.read_text())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _hash_prefix(path: Path, n: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = n
        while left > 0:
            b = f.read(min(CHUNK_BYTES * 8, left))
            if not b:
                break
            h.update(b)
            left -= len(b)
    return h


class _Transient(Exception):
    """A network error in the middle of the body: retried from the bytes already written."""


class _State:
    """Bytes held in the partial file and their running sha256 (kept across retries)."""

    def __init__(self, have: int, h) -> None:
        self.have, self.h = have, h


def _stream_into(out, url, headers, st: _State, total, repo, file, on_progress) -> None:
    """One GET (ranged when ``st.have`` > 0) appended to ``out``, updating ``st`` chunk by chunk."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    with hub_errors(repo, file):
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as r:
                hf_raise_for_status(r)
                if st.have and r.status_code == 200:  # the server ignored Range: start over
                    out.seek(0)
                    out.truncate()
                    st.have, st.h = 0, hashlib.sha256()
                for chunk in r.iter_bytes(CHUNK_BYTES):
                    out.write(chunk)
                    st.h.update(chunk)
                    st.have += len(chunk)
                    if on_progress:
                        on_progress(st.have, total or st.have)
        except Exception as e:
            if type(e).__module__.startswith(("httpx", "httpcore")) and not hasattr(e, "response"):
                raise _Transient(str(e)) from e
            if isinstance(e, (ConnectionError, TimeoutError)):
                raise _Transient(str(e)) from e
            raise


def download_file(repo: str, file: str, dest: Path, *, revision: str = "main", expected_sha256: str | None = None,
                  disk_free: Callable[[Path], int] = free_disk_bytes,
                  on_progress: Callable[[int, int], None] | None = None, retries: int = 3,
                  force: bool = False) -> dict:
    """Download ``repo``/``file`` to ``dest`` (via ``dest.partial``), verified; returns the sidecar dict.

    ``on_progress(done_bytes, total_bytes)`` is called per chunk (the Rich bar; tests raise from it to
    simulate an interruption). Transient network errors are retried ``retries`` times from where the
    bytes stopped. Raises DownloadError: access, not found, not enough disk space (before any byte is
    fetched), size or sha256 mismatch (the partial file is deleted; an existing ``dest`` is untouched).
    """
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.utils import build_hf_headers

    from localrun.machine.hardware import fmt_bytes

    url = _file_url(repo, file, revision)
    with hub_errors(repo, file):
        meta = get_hf_file_metadata(url, token=hub_token(), endpoint=hub_endpoint())
    total = meta.size
    etag = (meta.etag or "").strip('"')
    sha256 = (expected_sha256 or (etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None))
    old_side = read_sidecar(dest) if dest.exists() else None
    if not force and old_side and sha256 and old_side.get("sha256") == sha256 and dest.stat().st_size == total:
        return {**old_side, "status": "up-to-date"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + PARTIAL_SUFFIX)
    pmeta = dest.with_name(dest.name + PARTIAL_SUFFIX + ".json")
    have = partial.stat().st_size if partial.exists() else 0
    old = json.loads(pmeta.read_text()) if pmeta.exists() else {}
    if have and (old.get("etag") != etag or old.get("size") != total or (total and have > total)):
        partial.unlink()  # a different version of the file: start over
        have = 0
    need = (total or 0) - have
    free = disk_free(dest.parent)
    if total and need > free:
        raise DownloadError(
            f"not enough disk space for {file}: needs {fmt_bytes(need)}, {fmt_bytes(free)} free on "
            f"{dest.parent}",
            hint="free some space (`localrun rm MODEL`), or point LOCALRUN_MODELS at a bigger disk")
    write_json_atomic(pmeta, {"etag": etag, "size": total, "repo": repo, "file": file})
    h = _hash_prefix(partial, have) if have else hashlib.sha256()
    resumed_from = have
    headers = build_hf_headers(token=hub_token())
    headers["Accept-Encoding"] = "identity"
    attempt = 0
    st = _State(have, h)
    with open(partial, "ab") as out:
        while total is None or st.have < total:
            if st.have:
                headers["Range"] = f"bytes={st.have}-"
            try:
                _stream_into(out, url, headers, st, total, repo, file, on_progress)
                if total is None:
                    total = st.have
            except _Transient as e:
                out.flush()
                attempt += 1
                if attempt > retries:
                    raise DownloadError(
                        f"the connection to {hub_endpoint()} kept failing while downloading {file} ({e.__cause__})",
                        hint=f"{fmt_bytes(st.have)} are kept in {partial.name}: run the same pull again to resume"
                    ) from None
                time.sleep(min(2 ** attempt, 8) * 0.25)
    have, h = st.have, st.h
    if have != total:
        partial.unlink(missing_ok=True)
        pmeta.unlink(missing_ok=True)
        raise DownloadError(f"{file}: received {have:,} bytes, the hub says {total:,}",
                            hint="run the pull again")
    digest = h.hexdigest()
    if sha256 and digest != sha256:
        partial.unlink(missing_ok=True)
        pmeta.unlink(missing_ok=True)
        raise DownloadError(
            f"{file}: sha256 mismatch (got {digest[:16]}…, the hub says {sha256[:16]}…); the download was "
            "discarded" + (f" and {dest.name} was left as it was" if dest.exists() else ""),
            hint="run the pull again; if it repeats, the file changed on the hub or a proxy alters it")
    os.replace(partial, dest)
    pmeta.unlink(missing_ok=True)
    side = {"repo": repo, "file": file, "revision": revision, "commit": meta.commit_hash, "size_bytes": total,
            "sha256": digest, "etag": etag, "quant": quant_from_filename(file), "resumed_from_bytes": resumed_from,
            "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "status": "resumed" if resumed_from else "downloaded"}
    return side


_SPLIT = re.compile(r"-00001-of-(\d{5})\.gguf$", re.I)


def split_parts(file: str) -> list[str]:
    """``X-00001-of-00003.gguf`` → the three part names (llama.cpp's gguf-split naming); else ``[file]``."""
    m = _SPLIT.search(file)
    if not m:
        return [file]
    n = int(m.group(1))
    return [file[: m.start()] + f"-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def check_split_space(repo: str, parts: list[str], folder: Path, revision: str, disk_free) -> None:
    """Refuse a split download before its first byte when all its parts together do not fit the disk."""
    from huggingface_hub import get_hf_file_metadata

    from localrun.machine.hardware import fmt_bytes

    need = 0
    for part in parts:
        with hub_errors(repo, part):
            size = get_hf_file_metadata(_file_url(repo, part, revision), token=hub_token(),
                                        endpoint=hub_endpoint()).size or 0
        done = folder / Path(part).name
        need += 0 if done.exists() and done.stat().st_size == size else size
    free = disk_free(folder)
    if need > free:
        raise DownloadError(f"not enough disk space for {parts[0]} ({len(parts)} parts): needs {fmt_bytes(need)}, "
                            f"{fmt_bytes(free)} free on {folder}",
                            hint="free some space (`localrun rm MODEL`), or point LOCALRUN_MODELS at a bigger disk")

