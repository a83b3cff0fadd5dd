"""What a distributed checkpoint holds, as PyTorch's `torch.distributed.checkpoint.metadata` names it, stored as JSON.

`Metadata.state_dict_metadata` maps each flattened key ("model.layer.weight", "optim.state.w.exp_avg") to a
`TensorStorageMetadata` (dtype, global size, and the chunks that were saved: each a `ChunkStorageMetadata`
with its offsets and sizes in the global tensor, plus the shard file and the tensor name inside it) or to a
`BytesStorageMetadata` (a JSON value: ints, floats, strings, lists of them). `paths` records how each key was
built from the nested state dict, so a full nested dict can be rebuilt from the files alone (format_utils).

The JSON is the whole contract: the shard files are safetensors, so `json` and the `safetensors` package
read a checkpoint without flambeau.
"""
from __future__ import annotations

import dataclasses
import json

FORMAT = "flambeau-dcp"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"


class CheckpointException(BaseException):
    """A failure on one or more ranks during a checkpoint step (PyTorch's `CheckpointException`, a
    BaseException as there). `failures` maps each failing rank to its exception."""

    def __init__(self, msg: str, failures: dict) -> None:
        super().__init__(msg, failures)
        self._failures = failures

    @property
    def failures(self) -> dict:
        return self._failures

    def __str__(self) -> str:
        lines = [f"CheckpointException ranks:{sorted(self._failures)}"]
        lines += [f"Rank {rank}: {type(err).__name__}: {err}" for rank, err in sorted(self._failures.items())]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ChunkStorageMetadata:
    """One saved piece of a tensor: where it sits in the global tensor, and where its bytes are."""
    offsets: tuple
    sizes: tuple
    file: str = ""
    name: str = ""

    def to_json(self) -> dict:
        return {"offsets": list(self.offsets), "sizes": list(self.sizes), "file": self.file, "name": self.name}


@dataclasses.dataclass(frozen=True)
class TensorProperties:
    dtype: str


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: tuple
    chunks: list

    def to_json(self) -> dict:
        return {"type": "tensor", "dtype": self.properties.dtype, "size": list(self.size),
                "chunks": [c.to_json() for c in self.chunks]}


@dataclasses.dataclass
class BytesStorageMetadata:
    """A non-tensor value of the state dict, kept in the metadata itself as JSON."""
    value: object

    def to_json(self) -> dict:
        return {"type": "value", "value": self.value}


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    paths: dict = dataclasses.field(default_factory=dict)
    world_size: int = 1
    save_id: str = ""

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "world_size": self.world_size,
                           "save_id": self.save_id,
                           "state_dict_metadata": {k: v.to_json() for k, v in self.state_dict_metadata.items()},
                           "paths": self.paths}, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> "Metadata":
        """Parse and check a metadata file's text; ValueError naming `where` and the fault otherwise."""
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"distributed checkpoint metadata {where} is corrupt (not JSON: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"distributed checkpoint metadata {where} is not a {FORMAT} metadata file")
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"distributed checkpoint metadata {where} has version {doc.get('version')}; "
                             f"this flambeau reads version {FORMAT_VERSION}")
        try:
            entries = {key: _entry(e) for key, e in doc["state_dict_metadata"].items()}
            return cls(entries, {k: [tuple(p) for p in v] for k, v in doc["paths"].items()},
                       int(doc["world_size"]), str(doc["save_id"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"distributed checkpoint metadata {where} is corrupt (bad entry: "
                             f"{type(e).__name__}: {e})") from None


def _entry(e: dict):
    if e["type"] == "value":
        return BytesStorageMetadata(e["value"])
    if e["type"] != "tensor":
        raise ValueError(f"unknown entry type {e['type']!r}")
    size = tuple(int(s) for s in e["size"])
    chunks = []
    for c in e["chunks"]:
        offsets, sizes = tuple(int(o) for o in c["offsets"]), tuple(int(s) for s in c["sizes"])
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, size)):
            raise ValueError(f"chunk at {list(offsets)} of sizes {list(sizes)} lies outside {list(size)}")
        chunks.append(ChunkStorageMetadata(offsets, sizes, str(c["file"]), str(c["name"])))
    return TensorStorageMetadata(TensorProperties(str(e["dtype"])), size, chunks)
