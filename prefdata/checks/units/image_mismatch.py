"""The `image_mismatch` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="image_mismatch",
    order=23,
    severity="error",
    meaning="the prompt's image placeholders and the row's images differ in number",
    doc=(
        "an image pair's placeholders (image parts or the processor's own placeholder text, as rendered) and "
        "its images differ in number"
    ),
    raised_by=("prefdata.checks.images:image_flags", "prefdata.tokenize.vision:VisionPairTokenizer._place_images"),
    note="placeholders and images differ in number: the model would misalign them",
)
