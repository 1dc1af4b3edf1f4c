"""The report's image statistics (report.images) as a terminal line, Markdown and HTML.

Pairs with images and images in all, unique images (by content), bytes, width and height and tokens
per image (min / median / max, each dimension on its own), and pairs by how many images they have.
Every function returns nothing for a report without an `images` section (text-only data).
"""

from __future__ import annotations

from typing import Any, Mapping

from prefdata.report.render_common import esc, num

SPREADS = (("width", "width (px)"), ("height", "height (px)"), ("tokens_per_image", "tokens per image"))


def byte_size(value: int) -> str:
    """"512 B", "3.4 KiB", "45.6 MiB", "1.2 GiB"."""
    size, unit = float(value), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"


def images_summary(images: Mapping[str, Any], pairs: int) -> str:
    """"5 images in 4 of 6 pairs (3 unique; 1.2 MiB, 800.0 KiB unique)"."""
    return (
        f"{num(images['images'])} {'image' if images['images'] == 1 else 'images'} in {num(images['rows'])} of "
        f"{num(pairs)} pairs ({num(images['unique_images'])} unique; {byte_size(images['bytes'])}, "
        f"{byte_size(images['unique_bytes'])} unique)"
    )


def _spread(d: Mapping[str, Any]) -> str:
    return f"{num(d['min'])} / {num(d['median'])} / {num(d['max'])}"


def per_pair(images: Mapping[str, Any]) -> str:
    """Pairs by image count: "pairs with 0 / 1 / 2 images: 2 / 3 / 1"."""
    counts = images["rows_by_image_count"]
    word = "image" if list(counts) == ["1"] else "images"
    return f"pairs with {' / '.join(counts)} {word}: {' / '.join(num(n) for n in counts.values())}"


def images_text(report: Mapping[str, Any]) -> list[str]:
    """The terminal summary's lines (empty without images)."""
    images = report.get("images")
    if not images:
        return []
    sizes = f"width {_spread(images['width'])}, height {_spread(images['height'])} px"
    tokens = images.get("tokens_per_image")
    per_image = f"; tokens per image {_spread(tokens)}" if tokens else ""
    return [
        f"images: {images_summary(images, report.get('rows_checked', 0))}",
        f"images: {sizes}{per_image} (min / median / max); {per_pair(images)}",
    ]


def images_markdown(report: Mapping[str, Any]) -> list[str]:
    images = report.get("images")
    if not images:
        return []
    out = ["### Images", "", images_summary(images, report.get("rows_checked", 0)) + ".", "",
           "| | min | median | max | mean |", "| --- | ---: | ---: | ---: | ---: |"]
    for key, label in SPREADS:
        d = images.get(key)
        if d:
            out.append(f"| {label} | {num(d['min'])} | {num(d['median'])} | {num(d['max'])} | {num(d['mean'])} |")
    if not images.get("tokens_per_image"):
        out += ["", "Tokens per image: not counted (no `--processor`)."]
    counts = images["rows_by_image_count"]
    out += ["", "| images in the pair | " + " | ".join(counts) + " |", "| --- |" + " ---: |" * len(counts),
            "| pairs | " + " | ".join(f"{n:,}" for n in counts.values()) + " |", ""]
    return out


def images_html(report: Mapping[str, Any]) -> list[str]:
    images = report.get("images")
    if not images:
        return []
    out = [f"<h2>Images</h2><p>{esc(images_summary(images, report.get('rows_checked', 0)))}.</p>",
           "<table><tr><th></th><th>min</th><th>median</th><th>max</th><th>mean</th></tr>"]
    for key, label in SPREADS:
        d = images.get(key)
        if d:
            out.append(f"<tr><td>{esc(label)}</td>" + "".join(f"<td class=n>{esc(num(d[k]))}</td>"
                                                            for k in ("min", "median", "max", "mean")) + "</tr>")
    if not images.get("tokens_per_image"):
        out.append("<tr><td>tokens per image</td><td colspan=4 class=meaning>not counted (no --processor)</td></tr>")
    out.append("</table>")
    counts = images["rows_by_image_count"]
    peak = max(counts.values()) or 1
    out.append("<table><tr><th>images in the pair</th><th>pairs</th><th></th></tr>")
    for count, pairs in counts.items():
        out.append(f"<tr><td class=n>{esc(count)}</td><td class=n>{pairs:,}</td>"
                   f'<td><div class="meter"><span style="width:{pairs / peak * 100:.1f}%"></span></div></td></tr>')
    out.append("</table>")
    return out
