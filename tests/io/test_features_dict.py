"""OUT's dataset_info.json features, built without importing datasets (issue 45), are the ones
datasets builds for the same schema, so `load_from_disk(OUT)` reads OUT as before."""

from __future__ import annotations

import pyarrow as pa
import pytest
from datasets import Features, Image, List, load_from_disk

from prefdata.io.columns import CORE_SCHEMA, IMAGES_TYPE, LOSS_MASK_TYPE, messages_type
from prefdata.io.writer import _feature, features_dict, write_datasets_metadata

SCHEMAS = {
    "core": CORE_SCHEMA,
    "messages": pa.schema([("prompt", messages_type()), ("chosen", messages_type({"tool_calls", "reasoning_content"})),
                           ("rejected", messages_type({"name"}, parts=True))]),
    "pass-through": pa.schema([
        ("metadata", pa.struct([("score_chosen", pa.float64()), ("score_rejected", pa.float64())])),
        ("source_index", pa.int64()), ("mask", LOSS_MASK_TYPE), ("start", pa.int32()), ("ok", pa.bool_()),
        ("nothing", pa.null()), ("small", pa.float32()), ("half", pa.float16()), ("u", pa.uint16()),
        ("blob", pa.binary()), ("big", pa.large_string()), ("nested", pa.list_(pa.list_(pa.string()))),
    ]),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_features_are_what_datasets_builds(name):
    schema = SCHEMAS[name]
    assert all(_feature(field.type) is not None for field in schema)  # really built by hand
    assert features_dict(schema) == Features.from_arrow_schema(schema).to_dict()


def test_images_are_described_as_datasets_images():
    schema = CORE_SCHEMA.append(pa.field("images", IMAGES_TYPE))
    expected = Features.from_arrow_schema(schema)
    expected["images"] = List(Image())
    assert features_dict(schema) == expected.to_dict()


def test_types_not_built_by_hand_are_still_described_by_datasets():
    schema = pa.schema([("when", pa.timestamp("s")), ("fixed", pa.list_(pa.int8(), 3)),
                        ("ids", pa.large_list(pa.int32()))])
    assert _feature(schema.field("when").type) is None
    assert features_dict(schema) == Features.from_arrow_schema(schema).to_dict()


def test_out_written_with_these_features_loads_with_datasets(tmp_path):
    table = pa.table({"prompt": ["p"], "meta": [{"a": 1.5}], "ids": [[1, 2]]},
                     schema=pa.schema([("prompt", pa.string()), ("meta", pa.struct([("a", pa.float64())])),
                                       ("ids", pa.list_(pa.int32()))]))
    with pa.ipc.new_stream(str(tmp_path / "data-00000-of-00001.arrow"), table.schema) as stream:
        stream.write_table(table)
    write_datasets_metadata(tmp_path, table.schema, [{"filename": "data-00000-of-00001.arrow"}], "f" * 16)
    loaded = load_from_disk(str(tmp_path))
    assert loaded[0] == {"prompt": "p", "meta": {"a": 1.5}, "ids": [1, 2]}
    assert loaded.features.to_dict() == Features.from_arrow_schema(table.schema).to_dict()
