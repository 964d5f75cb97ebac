"""`localrun pull`: download a GGUF from the Hugging Face Hub into the model store, resumably and verified.

What can be pulled (``parse_ref``)::

    qwen3-8b                     a models.toml catalog name: the planner picks the quantization
    qwen3-8b:Q4_K_M              … at this quantization
    hf.co/OWNER/REPO[:QUANT]     any GGUF repo (also huggingface.co/…, https://huggingface.co/…)
    hf.co/OWNER/REPO/FILE.gguf   one file (also …/resolve/REV/FILE and …/blob/REV/FILE URLs)

Where it goes: ``<models_dir>/<name>/<file>`` plus ``<file>.localrun.json`` (repo, file, quant, size,
sha256, commit), where ``name`` is the catalog name or ``OWNER--REPO`` for hub references.

How it downloads (``localrun.store.download.download_file``): ``huggingface_hub.get_hf_file_metadata`` (HEAD
…/resolve/REV/FILE) gives the size (``X-Linked-Size``), the commit and the LFS sha256 (``X-Linked-Etag``); the
body is streamed with the hub's own HTTP session into ``<file>.partial`` and hashed as it arrives; a second
pull of an interrupted download hashes the bytes already there and asks for the rest (``Range: bytes=N-``).
Only a file whose size and sha256 both match is renamed onto ``<file>``, so a broken download never replaces a
good one. Free disk space is checked before the first byte. The hub endpoint is ``HF_ENDPOINT`` (read at call
time) and the token ``HF_TOKEN`` (or ``huggingface-cli login``).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from localrun.errors import DownloadError, ModelNotFoundError
from localrun.model.catalog import (
    UNQUANTIZED,
    CatalogEntry,
    estimate_file_bytes,
    get_entry,
    normalize_quant,
    quant_from_filename,
)
from localrun.store.download import (
    SIDECAR_SUFFIX,
    check_split_space,
    download_file,
    free_disk_bytes,
    hub_endpoint,
    hub_errors,
    hub_token,
    split_parts,
    write_json_atomic,
)

FIT_MARGIN = 1.2  # the simple rule: file size + 20% must fit in VRAM or RAM

_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:www\.)?(?:hf\.co|huggingface\.co)/", re.I)


@dataclass
class PullRef:
    """What the user asked for. ``file`` set = one exact file; else ``quant`` (None = planner's choice)."""

    name: str  # store folder: catalog name or OWNER--REPO
    repo: str | None = None
    file: str | None = None
    quant: str | None = None
    revision: str = "main"
    entry: CatalogEntry | None = None


@dataclass
class RemoteFile:
    repo: str
    file: str
    quant: str | None
    size_bytes: int | None = None  # None = not known yet (estimated sizes go to estimated_bytes)
    sha256: str | None = None
    estimated_bytes: int | None = None

    @property
    def best_size(self) -> int:
        return self.size_bytes or self.estimated_bytes or 0


@dataclass
class PullResult:
    name: str
    repo: str
    file: str
    quant: str | None
    path: str
    size_bytes: int
    sha256: str | None
    commit: str | None
    status: str  # downloaded | resumed | up-to-date
    reason: str = ""
    resumed_from_bytes: int = 0
    elapsed_s: float = 0.0
    mmproj: str | None = None  # the vision projector pulled beside the model (a catalog entry's), its path
    note: str = ""  # what the user should know: a projector localrun cannot use yet, left on the hub

    def to_dict(self) -> dict:
        return asdict(self)


# --- references -------------------------------------------------------------------------------


def parse_ref(ref: str) -> PullRef:
    """A pull argument → ``PullRef``. Raises ModelNotFoundError (exit 2) for a name the catalog does not
    have (with "did you mean …?") or a quantization it lists no file for, DownloadError for a malformed
    hub reference."""
    ref = ref.strip()
    if _HUB_PREFIX.match(ref) or (ref.count("/") >= 1 and not get_entry(ref)):
        rest = _HUB_PREFIX.sub("", ref)
        quant = None
        if ":" in rest.rsplit("/", 1)[-1]:
            rest, quant = rest.rsplit(":", 1)
            quant = normalize_quant(quant)
        parts = [p for p in rest.split("/") if p]
        if len(parts) < 2:
            raise DownloadError(
                f"not a Hugging Face reference: {ref!r}",
                hint="use hf.co/OWNER/REPO[:QUANT], hf.co/OWNER/REPO/FILE.gguf or a catalog name",
            )
        repo = f"{parts[0]}/{parts[1]}"
        revision, file = "main", None
        tail = parts[2:]
        if len(tail) >= 2 and tail[0] in ("resolve", "blob"):
            revision, tail = tail[1], tail[2:]
        if tail:
            file = "/".join(tail)
            if not file.lower().endswith(".gguf"):
                raise DownloadError(f"{file!r} is not a .gguf file", hint="localrun pulls GGUF files")
            quant = quant or quant_from_filename(file)
        return PullRef(name=f"{parts[0]}--{parts[1]}", repo=repo, file=file, quant=quant, revision=revision)
    base, _, quant = ref.partition(":")
    entry = get_entry(base)
    if entry is None:
        from localrun.store.resolve import did_you_mean

        raise ModelNotFoundError(
            ref,
            message=f"{base!r} is not in the catalog",
            hint=did_you_mean(ref) + "`localrun ls --catalog` lists the catalog; any GGUF "
            "repo works as hf.co/OWNER/REPO[:QUANT]",
        )
    q = normalize_quant(quant) if quant else None
    if q and q not in {k.upper() for k in entry.quants}:
        raise ModelNotFoundError(
            ref,
            message=f"{entry.name} has no {q} in the catalog",
            hint=f"available: {', '.join(entry.quants)}; or pull hf.co/OWNER/REPO:{q}",
        )
    return PullRef(name=entry.name, quant=q, entry=entry)


def list_repo_ggufs(repo: str, revision: str = "main") -> list[RemoteFile]:
    """The .gguf files of a hub repo with size and LFS sha256 (``HfApi.model_info(files_metadata=True)``).

    Split files (``-00002-of-00003.gguf``) and multimodal projectors (``mmproj``) are left out.
    """
    from huggingface_hub import HfApi

    with hub_errors(repo, "the file list"):
        info = HfApi(endpoint=hub_endpoint(), token=hub_token()).model_info(
            repo, revision=None if revision == "main" else revision, files_metadata=True
        )
    out = []
    for s in info.siblings or []:
        name = s.rfilename
        low = name.lower()
        if not low.endswith(".gguf") or "mmproj" in low or re.search(r"-0000[2-9]-of-|-000[1-9]\d-of-", low):
            continue
        out.append(
            RemoteFile(
                repo,
                name,
                quant_from_filename(name),
                size_bytes=(s.lfs.size if s.lfs else s.size),
                sha256=(s.lfs.sha256 if s.lfs else None),
            )
        )
    return out


def candidates(ref: PullRef) -> list[RemoteFile]:
    """Every file ``ref`` could mean, with sizes from the hub where it answers (else an estimate)."""
    if ref.file:
        return [RemoteFile(ref.repo, ref.file, ref.quant)]
    if ref.repo:
        files = list_repo_ggufs(ref.repo, ref.revision)
        if not files:
            raise ModelNotFoundError(
                ref.repo,
                message=f"{ref.repo} has no .gguf files",
                hint="localrun runs GGUF models; look for a -GGUF repository",
            )
        if ref.quant:
            have = sorted({f.quant for f in files if f.quant})
            files = [f for f in files if (f.quant or "").upper() == ref.quant]
            if not files:
                raise ModelNotFoundError(
                    ref.repo,
                    message=f"{ref.repo} has no {ref.quant} file",
                    hint=f"it has {', '.join(have) or 'other files'}: pull hf.co/{ref.repo}:QUANT with one of them",
                )
        return files
    entry = ref.entry
    assert entry is not None
    out = []
    for q, src in entry.sources.items():
        if q == "mlx" or (ref.quant and q.upper() != ref.quant):
            continue
        out.append(RemoteFile(src["repo"], src["file"], q, estimated_bytes=estimate_file_bytes(entry, q)))
    # real sizes, one listing per repo; a catalog that cannot reach the hub still plans on estimates
    for repo in {f.repo for f in out}:
        try:
            listed = {r.file: r for r in list_repo_ggufs(repo)}
        except (DownloadError, ModelNotFoundError):
            continue
        for f in out:
            if f.repo == repo and f.file in listed:
                f.size_bytes, f.sha256 = listed[f.file].size_bytes, listed[f.file].sha256
        missing = [f for f in out if f.repo == repo and f.file not in listed and split_parts(f.file) == [f.file]]
        out = [f for f in out if f not in missing]  # the hub no longer has it: do not choose it
    if not out:
        raise DownloadError(
            f"none of {entry.name}'s catalog files is on the hub any more",
            hint="pull a repo directly: hf.co/OWNER/REPO[:QUANT]",
        )
    return out


def memory_budget_bytes(hw) -> tuple[int, str]:
    """The most a model may occupy on ``hw``: the larger of GPU memory (sum of usable VRAM, or the Apple
    working set) and available RAM, and a word saying which."""
    vram = sum(g.usable_bytes for g in hw.gpus)
    ram = hw.ram_available_bytes
    return (vram, "VRAM") if vram >= ram else (ram, "RAM")


def choose_quant(files: list[RemoteFile], hw, entry: CatalogEntry | None = None) -> tuple[RemoteFile, str]:
    """The best file for ``hw`` and why.

    With a catalog ``entry`` the planner decides (``localrun.offload.choose.choose``: every quantization
    is planned from the catalog's dimensions; the best quality that fits and decodes ≥ 5 tok/s wins).
    Otherwise — a bare hub repo, or the planner finds nothing that fits — the simple rule: the largest
    quantized file whose size × 1.2 fits the memory budget (unquantized F16/BF16/F32 only when nothing
    quantized exists), else the smallest.
    """
    from localrun.machine.hardware import fmt_bytes

    if len(files) == 1:
        return files[0], "the only file"
    picked = _planner_choice(files, hw, entry) if entry is not None else None
    if picked:
        return picked
    budget, where = memory_budget_bytes(hw)
    quantized = [f for f in files if (f.quant or "") not in UNQUANTIZED] or files
    ranked = sorted(quantized, key=lambda f: f.best_size, reverse=True)
    for f in ranked:
        if f.best_size * FIT_MARGIN <= budget:
            return f, (
                f"{f.quant}: the largest quantization whose {fmt_bytes(f.best_size)} + 20% fits "
                f"the {fmt_bytes(budget)} of {where} available"
            )
    f = ranked[-1]
    return f, (
        f"{f.quant}: the smallest quantization; {fmt_bytes(f.best_size)} does not fit the "
        f"{fmt_bytes(budget)} of {where} available (it will run partly from disk, slowly)"
    )


def _planner_choice(files: list[RemoteFile], hw, entry: CatalogEntry):
    """(file, reason) from the planner's quant-ladder search, or None when it is unavailable or nothing
    fits (the caller then applies the simple rule)."""
    try:
        from localrun.machine.measurements import planner_measurement
        from localrun.model.synthetic import spec_from_entry, supported_quants
        from localrun.offload.choose import Candidate, choose
    except ImportError:
        return None
    by_quant = {(f.quant or "").upper(): f for f in files}
    ok = set(supported_quants())
    cands = [Candidate(q, spec_from_entry(entry, q), "catalog") for q in by_quant if q in ok]
    if not cands:
        return None
    chosen, _plans = choose(cands, hw, measurement=planner_measurement("llamacpp"))
    if chosen is None:
        return None
    f = by_quant[chosen.quant.upper()]
    extra = [r for r in chosen.reasons[1:3]]
    speed = f"; predicted decode {chosen.decode_tok_s:.1f} tok/s" if chosen.decode_tok_s else ""
    return f, "; ".join([chosen.reasons[0], *extra]) + speed


def pull(
    ref: str,
    *,
    models_dir: Path | None = None,
    hardware=None,
    disk_free: Callable[[Path], int] = free_disk_bytes,
    on_progress: Callable[[int, int], None] | None = None,
    on_plan: Callable[[RemoteFile, str], None] | None = None,
    force: bool = False,
) -> PullResult:
    """Resolve ``ref``, choose the file (``choose_quant`` when no quant is given), download it into the
    store and write its sidecar. A file already there with the hub's sha256 is not fetched again
    (``status="up-to-date"``) unless ``force``. ``on_plan(file, reason)`` is called before the download.

    Raises ModelNotFoundError (exit 2) when ``ref`` names nothing (an unknown catalog name, a repository,
    quantization or file the hub does not have) and DownloadError (exit 10) for access, network, checksum
    and disk-space failures.
    """
    from localrun.config import get_settings

    t0 = time.monotonic()
    pref = parse_ref(ref)
    models_dir = models_dir or get_settings().models_dir
    files = candidates(pref)
    if pref.file or pref.quant or len(files) == 1:
        chosen, reason = files[0], ("the requested file" if pref.file else f"{files[0].quant} as requested")
    else:
        if hardware is None:
            from localrun.machine.hardware import probe_hardware

            hardware = probe_hardware(models_dir)
        chosen, reason = choose_quant(files, hardware, pref.entry)
    if on_plan:
        on_plan(chosen, reason)
    dest = models_dir / pref.name / Path(chosen.file).name
    parts = split_parts(chosen.file)
    if len(parts) > 1:
        check_split_space(chosen.repo, parts, dest.parent, pref.revision, disk_free)
    for part in parts[1:]:  # llama.cpp opens a split GGUF from its first part and finds the rest beside it
        download_file(
            chosen.repo,
            part,
            dest.parent / Path(part).name,
            revision=pref.revision,
            disk_free=disk_free,
            on_progress=on_progress,
            force=force,
        )
    side = download_file(
        chosen.repo,
        chosen.file,
        dest,
        revision=pref.revision,
        expected_sha256=chosen.sha256,
        disk_free=disk_free,
        on_progress=on_progress,
        force=force,
    )
    if len(parts) > 1:
        side["parts"] = [Path(x).name for x in parts]
        side["size_bytes"] = sum((dest.parent / Path(x).name).stat().st_size for x in parts)
    status = side.pop("status", "downloaded")
    side.update(name=pref.name, quant=chosen.quant or side.get("quant"))
    if status != "up-to-date":
        write_json_atomic(dest.with_name(dest.name + SIDECAR_SUFFIX), side)
    mmproj, note = _pull_projector(pref, dest.parent, disk_free, on_progress, force)
    return PullResult(
        pref.name,
        chosen.repo,
        chosen.file,
        side["quant"],
        str(dest),
        side["size_bytes"],
        side["sha256"],
        side.get("commit"),
        status,
        reason,
        side.get("resumed_from_bytes", 0) if status == "resumed" else 0,
        time.monotonic() - t0,
        mmproj,
        note,
    )


def _pull_projector(pref: PullRef, folder: Path, disk_free, on_progress, force: bool) -> tuple[str | None, str]:
    """A catalog entry's vision projector (models.toml ``[model.mmproj]``) downloaded into ``folder`` beside
    the model under its hub name (``mmproj-*.gguf``: ``loading.find_mmproj`` loads it with the model), verified
    like the model → (its path, ""). A projector localrun cannot use yet (``refused``) is not fetched →
    (None, why). Nothing for a hub reference or a text model."""
    mm = pref.entry.mmproj if pref.entry is not None else {}
    if not mm:
        return None, ""
    if mm.get("refused"):
        return None, f"text only: {mm['refused']}, so its projector ({mm['repo']}/{mm['file']}) was not pulled"
    dest = folder / Path(mm["file"]).name
    side = download_file(mm["repo"], mm["file"], dest, disk_free=disk_free, on_progress=on_progress, force=force)
    if side.pop("status", "downloaded") != "up-to-date":
        side.update(name=pref.name, role="mmproj")
        write_json_atomic(dest.with_name(dest.name + SIDECAR_SUFFIX), side)
    return str(dest), ""
