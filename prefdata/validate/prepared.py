"""`validate` on a prepared OUT/: its stored rows re-checked from their columns (the ids are what
training sees), with the checks `prepare` ran; flags that need the original tokenization or the raw
shape are taken as stored."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from prefdata.checks.policy import Policy
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.records import CheckedRow, RawRecord
from prefdata.io.manifest import MANIFEST_NAME, read_manifest, verify_out
from prefdata.io.out_dir import load_out_dataset
from prefdata.io.messages import text_of
from prefdata.report.builder import ReportBuilder
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.tokenize.select import select_pair_tokenizer

if TYPE_CHECKING:
    from prefdata.checks.partitioned import PartitionedResult

# Flags the stored rows keep from `prepare` because re-checking cannot recompute them without
# re-tokenizing the original text (what was cut, how the template split the prompt) or the raw shape.
_STORED_TOKEN_FLAGS = (F.COMPLETION_TRUNCATED, F.PROMPT_BOUNDARY_MISMATCH, F.SYSTEM_LOST, F.TURN_RENDERS_DIFFERENTLY)
_STORED_PAIR_FLAGS = (F.MULTI_TURN_COMPLETION, F.TIED_REWARD, F.REWARD_DISAGREES, F.ENVIRONMENT_DIFFERS,
                      F.DIVERGES_AT_NON_MODEL_TURN, F.UNEQUAL_TURNS)


def is_prepared_dir(path: str | Path) -> bool:
    """A directory written by `prefdata prepare`: a manifest next to a save_to_disk dataset."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST_NAME).is_file() and (p / "state.json").is_file()


def check_prepared(
    input_path: Path, builder: ReportBuilder, policy: Policy, *, against: str | Path | None, progress: bool, batch_size: int,
    benchmarks: BenchmarkIndex | None = None, image_tokens: Callable[[list[Any]], list[int]] | None = None,
) -> None:
    answers, rows = prepared_rows(input_path, policy=policy, against=against, progress=progress, batch_size=batch_size,
                                  benchmarks=benchmarks, image_tokens=image_tokens)
    for row in rows:
        builder.add(row)
    # The near-duplicate prompt groups are row ordinals, which builder.location() resolves.
    builder.add_near_duplicate_prompts(answers.near_duplicate_groups, builder.location)


def image_token_counter(processor: str | None, out: Path, trust_remote_code: bool) -> Callable[[list[Any]], list[int]] | None:
    """With --processor on a prepared OUT/: each stored image's tokens, counted by the processor, which
    must be the one OUT was prepared with (another one's counts would not describe OUT's ids)."""
    if not processor:
        return None
    from prefdata.tokenize.settings import TokenizeSettings

    try:
        recorded = read_manifest(out).get("processor") or {}
    except OSError:  # an OUT that kept no pair has no manifest: nothing to count against
        recorded = {}
    if not recorded:
        raise PrefdataError(f"--processor was given but {out} was not prepared with one (it holds no image pairs)")
    vision = select_pair_tokenizer(None, processor, TokenizeSettings(), trust_remote_code)
    found, expected = vision.fingerprint(), str(recorded.get("fingerprint") or "")
    if found != expected:
        raise PrefdataError(
            f"the processor at {processor} ({found[:19]}) differs from the one {out} was prepared with "
            f"({recorded.get('path')}, {expected[:19]}): its image token counts would not describe OUT's ids"
        )
    return vision.image_token_counts  # type: ignore[union-attr]


def prepared_rows(
    out_dir: str | Path,
    *,
    policy: Policy,
    against: str | Path | None = None,
    progress: bool = True,
    batch_size: int = 1000,
    benchmarks: BenchmarkIndex | None = None,
    image_tokens: Callable[[list[Any]], list[int]] | None = None,
) -> tuple[PartitionedResult, Iterator[Any]]:
    """(the dataset-wide answers, the re-checked rows) of a prepared OUT/, once `verify_out` has
    checked that OUT reads nothing outside it and that its ledger matches its files.

    The answers come from a first pass over the stored rows' digests (prefdata.checks.partitioned:
    duplicate and conflicting pairs, near-duplicate prompt groups by row ordinal); the rows are
    then streamed in record batches. Each row is rebuilt as Pair + TokenizedPair from its columns
    and goes through the same checks as in `prepare`: text flags, token flags on the stored ids,
    dataset-wide duplicates, prompt leaks, non-finite reference log-probs. Flags that need the
    original tokenization are taken as stored.

    Image pairs: the stored images are read (their headers only: sizes, not pixels) and their bytes
    count in the duplicate checks as in `prepare`; `image_tokens` (a processor's
    VisionPairTokenizer.image_token_counts) gives each image's tokens for the report."""
    from prefdata.checks.partitioned import partitioned_on

    dataset, images = _open_out(out_dir)
    answers = partitioned_on(None, _digest_blocks(out_dir, dataset, images, batch_size, policy),
                             policy.near_duplicate_prompt_threshold)
    rows = _checked_rows(out_dir, dataset, images, answers, policy, against, progress, batch_size, benchmarks,
                         image_tokens)
    return answers, rows


def _checked_rows(
    out_dir: str | Path, dataset: Any, images: Any, answers: PartitionedResult, policy: Policy,
    against: str | Path | None, progress: bool, batch_size: int, benchmarks: BenchmarkIndex | None,
    image_tokens: Callable[[list[Any]], list[int]] | None,
) -> Iterator[Any]:
    """The second pass: every stored row re-checked, with its dataset-wide flags from `answers`."""
    from prefdata.checks.checker import PairChecker
    from prefdata.checks.partitioned import dataset_flags

    checker = PairChecker(policy, _leak_index(against) if against is not None else None, benchmarks)
    has_refs = "ref_chosen_logps" in dataset.column_names and "ref_rejected_logps" in dataset.column_names
    batches = _stored_batches(out_dir, dataset, images, batch_size, policy)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="checking", unit=" batches", total=math.ceil(len(dataset) / batch_size), disable=None)
    ordinal = 0  # the row's index: what near-duplicate prompt clusters report
    for batch, pairs in batches:
        duplicate, conflicting = answers.flags_of(np.arange(ordinal, ordinal + len(pairs)))
        for i, pair in enumerate(pairs):
            tokenized, extra = _stored_tokens(batch, i, has_refs)
            if pair.image_data:
                tokenized.image_tokens = image_tokens(pair.image_data) if image_tokens is not None else None
            extra += dataset_flags(bool(duplicate[i]), bool(conflicting[i]))
            kept, severity, outcome = checker.check(pair, tokenized, extra)
            raw = RawRecord(source_file=pair.source_file, source_line=pair.source_line)
            yield CheckedRow(raw, pair, tokenized, kept, severity, outcome)
        ordinal += len(pairs)


def _open_out(out_dir: str | Path) -> tuple[Any, Any]:
    """(OUT's dataset without its images, the images column or None), once OUT is verified."""
    verify_out(out_dir)  # a handed-over OUT: nothing read from outside it, its ledger matching its files
    try:
        dataset = load_out_dataset(out_dir, "validate")
    except PrefdataError:
        raise
    except Exception as exc:  # a damaged OUT/ is an input error, not a crash
        raise PrefdataError(f"{out_dir}: cannot load the prepared dataset ({type(exc).__name__}: {exc})") from None
    missing = {"prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "source_file", "source_line"} - set(
        dataset.column_names
    )
    if missing:
        raise PrefdataError(f"{out_dir}: not a prefdata dataset (missing columns: {', '.join(sorted(missing))})")
    # Image pairs: the images' bytes straight from the Arrow table, never decoded by `datasets`.
    images = dataset.data.column("images") if "images" in dataset.column_names else None
    return (dataset.remove_columns("images") if images is not None else dataset), images


def _digest_blocks(out_dir: str | Path, dataset: Any, images: Any, batch_size: int, policy: Policy) -> list[Any]:
    """The first pass: each batch's digests (prefdata.checks.digests), rows numbered from 0."""
    from prefdata.checks.digests import digest_block

    blocks, ordinal = [], 0
    for _, pairs in _stored_batches(out_dir, dataset, images, batch_size, policy):
        blocks.append(digest_block(range(ordinal, ordinal + len(pairs)), pairs))
        ordinal += len(pairs)
    return blocks


def _stored_batches(out_dir: str | Path, dataset: Any, images: Any, batch_size: int, policy: Policy
                    ) -> Iterator[tuple[dict[str, list[Any]], list[Any]]]:
    """(batch of columns, its rows as Pairs: the text `prepare` checked, stored images and flags)."""
    from prefdata.core.records import Pair

    ordinal = 0
    for batch in dataset.iter(batch_size=batch_size):
        n = len(batch["prompt"])
        stored_images = images.slice(ordinal, n).to_pylist() if images is not None else None
        pairs = []
        for i in range(n):
            stored = batch["flags"][i] if "flags" in batch else []
            # Conversational rows are message lists: checked as the text `prepare` checked.
            prompt = text_of(batch["prompt"][i], completion=False)
            chosen, rejected = text_of(batch["chosen"][i], completion=True), text_of(batch["rejected"][i], completion=True)
            text_less = not (prompt or chosen or rejected)
            pair = Pair(
                source_file=batch["source_file"][i],
                source_line=batch["source_line"][i],
                prompt=prompt,
                chosen=chosen,
                rejected=rejected,
                # Ids on the Pair only when there is no text: the text checks then compare ids.
                prompt_ids=batch["prompt_ids"][i] if text_less else None,
                chosen_ids=batch["chosen_ids"][i] if text_less else None,
                rejected_ids=batch["rejected_ids"][i] if text_less else None,
                flags=[f for f in stored if f in _STORED_PAIR_FLAGS],
            )
            if stored_images is not None and stored_images[i]:
                pair.image_data = _stored_images(stored_images[i], pair, out_dir, policy.max_image_pixels)
            pairs.append(pair)
        yield batch, pairs
        ordinal += n


def _stored_tokens(batch: dict[str, list[Any]], i: int, has_refs: bool) -> tuple[Any, list[str]]:
    """(the row's TokenizedPair from its stored ids and flags, the flags found on its columns)."""
    from prefdata.core.records import TokenizedPair

    stored = batch["flags"][i] if "flags" in batch else []
    prompt_ids, chosen_ids, rejected_ids = batch["prompt_ids"][i], batch["chosen_ids"][i], batch["rejected_ids"][i]
    tokenized = TokenizedPair(
        prompt_ids=prompt_ids,
        chosen_ids=chosen_ids,
        rejected_ids=rejected_ids,
        prompt_len_full=len(prompt_ids),
        chosen_len_full=len(chosen_ids),
        rejected_len_full=len(rejected_ids),
        flags=[f for f in stored if f in _STORED_TOKEN_FLAGS],
    )
    non_finite = has_refs and not all(
        v is not None and math.isfinite(v) for v in (batch["ref_chosen_logps"][i], batch["ref_rejected_logps"][i])
    )
    extra = [F.NON_FINITE_REF_LOGPS] if non_finite else []
    if _untrained_half(batch, i):  # checked on the stored masks, as refs and train read them
        extra.append(F.NO_TRAINED_TOKENS)
    return tokenized, extra


def _untrained_half(batch: dict[str, list[Any]], i: int) -> bool:
    """Whether a half's stored loss mask has no 1 past its loss start (`no_trained_tokens`)."""
    for half in ("chosen", "rejected"):
        mask = batch.get(f"{half}_loss_mask", [None] * (i + 1))[i]
        start = batch.get(f"{half}_loss_start", [None] * (i + 1))[i] or 0
        if mask is not None and not any(mask[start:]):
            return True
    return False


def _stored_images(values: list[dict[str, Any]], pair: Any, out_dir: str | Path, max_pixels: int) -> list[Any]:
    from prefdata.core.errors import RecordError
    from prefdata.io.images import stored_images

    try:
        return stored_images(values, max_pixels)
    except RecordError as exc:  # a damaged OUT/ is an input error
        raise PrefdataError(f"{out_dir}: the row from {pair.source_file}:{pair.source_line}: {exc}") from None


def _leak_index(against: str | Path) -> Any:
    """Prompts of OTHER: a prepared OUT/ (its prompt column) or raw data (read like INPUT)."""
    if is_prepared_dir(against):
        from prefdata.checks.dataset import PromptLeakIndex

        verify_out(against)
        dataset = load_out_dataset(against, "validate --against")

        def prompts() -> Iterator[Any]:
            for batch in dataset.select_columns(["prompt", "prompt_ids"]).iter(batch_size=4096):
                for text, ids in zip(batch["prompt"], batch["prompt_ids"]):
                    text = text_of(text, completion=False)
                    yield text if text else ids

        return PromptLeakIndex(prompts())
    from prefdata.checks.checker import build_leak_index

    return build_leak_index(against)
