"""A small mixed input through `prefdata prepare`: every count the user reads says its denominator and
agrees across the terminal summary, report.md, report.html, the GitHub notice and report.json
(issue 40, item 8: "quarantined 3 = 10.7% of rows" beside "12.0%" in the flag table; "5 rows with
errors ... 1 row with drop flags" for 5 dropped)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prefdata.report.render_github import github_annotations
from prefdata.report.render_text import render_text

ROWS = [
    {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Loud."},                         # kept
    {"prompt": "Name a fruit.", "chosen": "A pear.", "rejected": "A pear."},                      # identical: drop
    {"prompt": "Name a tree.", "chosen": "An oak.", "rejected": " An oak. "},                     # whitespace_only: drop
    {"prompt": "Name a tree.", "chosen": "An oak.", "rejected": " An oak. "},                     # + duplicate_pair: error
    {"prompt": "Name a river.", "chosen": "The Nile, the longest river in Africa.",
     "rejected": "The Nile, the longest river in Africa!"},                                          # near_duplicate: warn
    {"prompt": "Name a bird.", "chosen": "A robin.", "rejected": "A rock."},                      # kept
    {"prompt": "Name a bird.", "chosen": "A robin.", "rejected": "A rock."},                      # duplicate_pair: error
]
BROKEN = ['{"prompt": "oops", "chosen": ', '{"prompt": "no halves"}']  # quarantined
COUNTS = re.compile(r"([\d,]+) of ([\d,]+) rows? with errors, ([\d,]+) with warnings(?:, ([\d,]+) with drop flags)?")


def _numbers(text: str) -> tuple[int, ...]:
    match = COUNTS.search(text)
    assert match, text
    return tuple(int((group or "0").replace(",", "")) for group in match.groups())


def test_every_render_of_a_mixed_prepare_prints_the_same_counts_with_denominators(tiny_tokenizer_dir, tmp_path):
    from prefdata.prepare import prepare

    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join([*map(json.dumps, ROWS), *BROKEN]) + "\n", encoding="utf-8")
    policy = tmp_path / "policy.toml"
    policy.write_text('[flags]\nduplicate_pair = "error"\n[thresholds]\nmax_dropped_share = 0.9\n', encoding="utf-8")
    out = tmp_path / "out"
    prepare(data, out, tokenizer=tiny_tokenizer_dir, policy=str(policy), progress=False, workers=1)

    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    acc = report["accounting"]
    rows_in, pairs = acc["rows_in"], report["rows_checked"]
    assert (rows_in, pairs, acc["rows_out"], acc["rows_dropped"], acc["rows_quarantined"]) == (9, 7, 3, 4, 2)
    # Each row once, at its worst severity: line 4 (whitespace_only + duplicate_pair) is an error row,
    # so the rows with errors and with drop flags are the 4 dropped pairs.
    assert report["flags"]["whitespace_only"]["count"] == 2 and report["flags"]["duplicate_pair"]["count"] == 2
    assert report["errors"] + report["drops"] == acc["rows_dropped"]
    expected = (report["errors"], rows_in, report["warnings"], report["drops"])
    assert expected == (2, 9, 3, 2)  # warnings: the near duplicate and the 2 quarantined records

    text = render_text(report)
    markdown = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    notice = github_annotations(report)[0]
    for name, rendering in (("text", text.splitlines()[0]), ("markdown", markdown), ("html", page), ("github", notice)):
        assert _numbers(rendering) == expected, name

    # Quarantined records are a share of the rows in, on the card and in both flag tables alike;
    # a flag is a share of the pairs checked, and says so.
    quarantined = f"{2 / rows_in:.1%} of {rows_in} rows"
    card = re.search(r'<div class="k">quarantined</div><div class="v">2</div><div class="s">([^<]*)</div>', page)
    assert card and card.group(1) == quarantined
    assert re.search(r"<code>quarantined</code>.*?<td class=n>2<div class=meaning>([^<]*)</div>", page).group(1) == quarantined
    assert f"| `quarantined` | warn | 2 | {quarantined} |" in markdown
    identical = f"{1 / pairs:.1%} of {pairs} pairs"
    assert re.search(r"<code>identical</code>.*?<td class=n>1<div class=meaning>([^<]*)</div>", page).group(1) == identical
    assert f"| `identical` | drop | 1 | {identical} |" in markdown
    # The cards' shares say what they are shares of, and add up with the rows in.
    for key, value in (("kept", acc["rows_out"]), ("dropped", acc["rows_dropped"])):
        assert f'<div class="k">{key}</div><div class="v">{value}</div><div class="s">{value / rows_in:.1%} of {rows_in} rows' in page
    # A dataset limit is a share of the pairs, and says so (the dropped card is a share of the rows in).
    dropped_share = f"{4 / pairs:.1%} of {pairs} pairs"
    assert f"| `max_dropped_share` | {dropped_share} | 90.0% | ok |" in markdown
    assert f"<td><code>max_dropped_share</code></td><td class=n>{dropped_share}</td>" in page
