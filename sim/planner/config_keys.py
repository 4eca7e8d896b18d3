"""The keys verl's and ROLL's configs define, shipped as data: ``timeshare plan`` checks a config against them.

verl runs on Hydra, whose struct mode refuses an override of a key the composed config does not have
(``Could not override 'actor_rollout_ref.actor.fsdp_config.param_ofload'``) and verl builds its config
sections into dataclasses, which refuse unknown fields; a typo is an error there, so it is one here
(:func:`check_config`), with the closest key the schema has. ROLL reads its YAML into dataclasses that
ignore unknown fields without a word; the plan refuses them all the same, since a key the plan reads
silently wrong is a wrong answer.

The data, in ``sim/planner/framework_configs/`` (regenerate with ``python -m sim.planner.config_keys``):

* ``verl-0.9.1-ppo_trainer.yaml`` and ``verl-0.9.1-ppo_megatron_trainer.yaml``: verl 0.9.1's composed trainer
  configs (``verl/trainer/config/_generated_ppo_trainer.yaml`` and ``_generated_ppo_megatron_trainer.yaml`` of
  the verl 0.9.1 wheel; Apache-2.0, the verl authors), with a header. They are the keys of verl's FSDP and
  Megatron strategies, and the defaults that ``--config-name ppo_trainer`` / ``ppo_megatron_trainer`` start from,
  as ``python -m verl.trainer.main_ppo`` does.
* ``roll-rlvr_config.json``: the keys of ROLL's ``RLVRConfig`` and of the dataclasses it holds, read from
  ROLL's source (``roll/pipeline/rlvr/rlvr_config.py``, ``roll/configs/*.py``) by :func:`roll_keys`.

A key is known when the schema has it, or when it lies below a key the schema leaves open: an empty
mapping (``override_config: {}``, a dict ROLL or verl passes through) or a null (a value the user fills in).
"""
from __future__ import annotations

import ast
import difflib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from sim.planner.plan_inputs import PlanInputError

#: where the schemas live
DATA = Path(__file__).resolve().parent / "framework_configs"
#: the verl version whose trainer configs are shipped (the ``verl`` extra pins 0.9.x)
VERL_VERSION = "0.9.1"
#: verl's trainer config of each training backend (``--config-name`` takes these names)
VERL_CONFIGS = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
#: Hydra's own top-level keys in a config file (the defaults list, Hydra's settings): not the trainer's
HYDRA_KEYS = ("defaults", "hydra")
#: keys of older verl that 0.9 moved or dropped: (prefix, what to say)
VERL_MOVED = (
    ("critic.model.fsdp_config.", "verl 0.8's name: verl 0.9 has the critic's FSDP settings at critic.fsdp.*"),
    ("actor_rollout_ref.actor.megatron.grad_offload", "verl 0.8's key: in verl 0.9 param_offload moves the "
     "gradients too"),
    ("actor_rollout_ref.ref.megatron.grad_offload", "verl 0.8's key: verl 0.9 has no grad_offload"),
    ("critic.megatron.grad_offload", "verl 0.8's key: in verl 0.9 param_offload moves the gradients too"),
)
#: the ROLL source files :func:`roll_keys` reads, and the pipeline config whose keys are checked
ROLL_FILES = ("roll/configs/base_config.py", "roll/configs/worker_config.py", "roll/configs/model_args.py",
              "roll/configs/training_args.py", "roll/configs/data_args.py", "roll/configs/generating_args.py",
              "roll/pipeline/rlvr/rlvr_config.py")
ROLL_CONFIG = "RLVRConfig"


class KeySchema:
    """The keys one framework config defines: its leaves, the mappings that hold them, and the open keys.

    Held as a tree of key segments; a segment ``*`` stands for any name (ROLL's ``rewards.*``: a mapping of
    named reward workers)."""

    def __init__(self, name: str, leaves: Iterable[str], open_: Iterable[str]):
        self.name = name  # in words, e.g. "verl 0.9.1's FSDP trainer config (ppo_trainer.yaml)"
        self.leaves = frozenset(leaves)
        self.open = frozenset(open_)
        self.nodes = frozenset(".".join(k.split(".")[:i]) for k in self.leaves for i in range(1, k.count(".") + 1))
        # sections the framework builds into a dataclass (verl's ``_target_``): unknown fields there are refused
        self.strict = frozenset(k.rpartition(".")[0] for k in self.leaves if k.endswith("._target_"))
        self._tree: dict[str, Any] = {}
        for key in self.leaves:
            self._add(key, "leaf")
        for key in self.open:
            self._add(key, "open")

    def _add(self, key: str, mark: str) -> None:
        node = self._tree
        for part in key.split("."):
            node = node.setdefault(part, {})
        node[f"<{mark}>"] = True

    @classmethod
    def from_keys(cls, name: str, leaves: Iterable[str], open_: Iterable[str]) -> "KeySchema":
        """A schema from its dotted leaf keys and open keys."""
        return cls(name, leaves, open_)

    def _walk(self, key: str) -> tuple[dict[str, Any] | None, bool]:
        """(the tree node at ``key`` or None, whether a leaf or open key lies on the way above it)."""
        node = self._tree
        for part in key.split("."):
            if "<leaf>" in node or "<open>" in node:
                return None, True
            nxt = node.get(part, node.get("*"))
            if nxt is None:
                return None, False
            node = nxt
        return node, False

    def knows(self, key: str) -> bool:
        """Whether ``key`` (dotted) is one this config defines, or lies below an open key or a leaf."""
        node, below = self._walk(key)
        return below or node is not None

    def has(self, key: str) -> bool:
        """Whether ``key`` is itself a key of this config (a leaf or a mapping), not merely below an open one."""
        node, _below = self._walk(key)
        return node is not None

    def strict_section(self, key: str) -> str | None:
        """The deepest section above ``key`` that the framework builds into a dataclass, or None."""
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:i]) in self.strict:
                return ".".join(parts[:i])
        return None

    def closest(self, key: str) -> str | None:
        """The known key most like ``key`` (difflib), looked for first below the deepest mapping ``key`` shares."""
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in self.nodes:
                near = difflib.get_close_matches(key, sorted(k for k in self.leaves if k.startswith(prefix + ".")),
                                                 n=1, cutoff=0.8)
                if near:
                    return near[0]
                break
        near = difflib.get_close_matches(key, sorted(self.leaves), n=1, cutoff=0.75)
        return near[0] if near else None


def flat_keys(data: Any, prefix: str = "") -> list[str]:
    """The dotted keys of the leaves of a nested mapping (an empty mapping is a leaf)."""
    if not isinstance(data, dict) or not data:
        return [prefix] if prefix else []
    out = []
    for k, v in data.items():
        out += flat_keys(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def _open_keys(data: Any, prefix: str = "") -> list[str]:
    """Keys of a nested mapping whose value is an empty mapping or null: a user may put anything below them."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if v is None or v == {}:
                out.append(key)
            else:
                out += _open_keys(v, key)
    return out


def verl_config_path(family: str) -> Path:
    """The shipped verl trainer config of a training backend (``fsdp`` or ``megatron``)."""
    return DATA / f"verl-{VERL_VERSION}-{VERL_CONFIGS[family]}.yaml"


@lru_cache(maxsize=None)
def verl_schema(family: str) -> KeySchema:
    """The keys of verl's trainer config for ``family`` (``fsdp``: ppo_trainer.yaml; ``megatron``: ppo_megatron_trainer.yaml)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(verl_config_path(family)), resolve=False)
    words = {"fsdp": "FSDP", "megatron": "Megatron"}[family]
    return KeySchema.from_keys(f"verl {VERL_VERSION}'s {words} trainer config ({VERL_CONFIGS[family]}.yaml)",
                               flat_keys(data), _open_keys(data))


@lru_cache(maxsize=None)
def roll_schema() -> KeySchema:
    """The keys of ROLL's ``RLVRConfig`` (shipped as ``roll-rlvr_config.json``)."""
    raw = json.loads((DATA / "roll-rlvr_config.json").read_text(encoding="utf-8"))
    return KeySchema.from_keys(f"ROLL's {ROLL_CONFIG} ({raw['source']})", raw["keys"], raw["open"])


def roll_source() -> str:
    """Where the shipped ROLL key list was read from, in words."""
    return json.loads((DATA / "roll-rlvr_config.json").read_text(encoding="utf-8"))["source"]


# --------------------------------------------------------------------------- the check


def _moved(key: str) -> str | None:
    for prefix, words in VERL_MOVED:
        if key.startswith(prefix):
            return words
    return None


def unknown_key_error(key: str, schema: KeySchema, other: KeySchema | None, where: str, strategy: str = "") -> str:
    """The one line that refuses ``key``: what it is not, what it may be instead, and the close match."""
    text = f"{where}: {key}: not a key of {schema.name}"
    other_strategy = other is not None and other.knows(key)
    if other_strategy:  # the key is right for the other strategy: a close match of this one's would mislead
        text += f"; it is a key of {other.name}, but the strategy is {strategy}"
    moved = _moved(key)
    if moved:
        text += f" ({moved})"
    near = None if other_strategy else schema.closest(key)
    if near:
        text += f"; did you mean {near}?"
    return text


def near_miss(key: str, reads: Iterable[str]) -> str | None:
    """A key the plan reads that ``key`` is one or two letters off, beside it in the same mapping (difflib)."""
    parent, _dot, last = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in reads if k.rpartition(".")[0] == parent and k != key}
    near = difflib.get_close_matches(last, list(siblings), n=1, cutoff=0.8)
    return siblings[near[0]] if near else None


def check_config(file_keys: Iterable[str], overrides: list[tuple[str, str, Any]], schema: KeySchema, *,
                 other: KeySchema | None = None, strategy: str = "", path: str = "",
                 reads: Iterable[str] = ()) -> list[str]:
    """Refuse the keys the framework would refuse, and those it would ignore beside a key the plan reads
    (:class:`PlanInputError`, one line with the closest key); returns the keys of the file it ignores.

    ``file_keys``: the dotted keys the user's config files set (Hydra's ``defaults`` and ``hydra`` left out).
    A key ``schema`` does not define is refused when it is a key of ``other`` (the framework's other strategy),
    when it lies in a section the framework builds into a dataclass (``_target_``: verl refuses unknown fields
    there), or when it is a near miss of a key in ``reads`` (the keys the plan reads: the framework ignores the
    typo and so would the plan); any other is ignored, as the framework ignores it.
    ``overrides``: ``(kind, key, value)`` with ``kind`` ``""`` (``KEY=VALUE``: the key must exist, in the schema or
    the file, as Hydra's struct mode demands), ``"+"`` (``+KEY=VALUE``: it must not; the key is added), ``"++"``
    (added or set) or ``"~"`` (deleted).
    """
    reads = list(reads)
    added = {key for kind, key, _value in overrides if kind in ("+", "++")}
    file_keys = [k for k in file_keys if k.split(".")[0] not in HYDRA_KEYS]
    ignored = []
    where = path or "the config"
    for key in file_keys:
        if schema.knows(key) or any(key == a or key.startswith(a + ".") for a in added):
            continue
        near = near_miss(key, reads)
        if (other is not None and other.knows(key)) or schema.strict_section(key):
            raise PlanInputError(unknown_key_error(key, schema, other, where, strategy))
        if near:
            raise PlanInputError(f"{where}: {key}: not a key of {schema.name}, which ignores it without a word, and so "
                                 f"would the plan; did you mean {near}?")
        ignored.append(key)
    in_file = set(file_keys) | {".".join(k.split(".")[:i]) for k in file_keys for i in range(1, k.count(".") + 1)}
    for kind, key, _value in overrides:
        exists = schema.has(key) or key in in_file or (schema.knows(key) and not schema.strict_section(key))
        if kind in ("", "~") and not exists:
            raise PlanInputError(unknown_key_error(key, schema, other, f"override {kind}".rstrip(), strategy)
                                 + " (Hydra refuses to set a key the config does not have; +KEY=VALUE adds one)")
        if kind == "+" and (schema.has(key) or key in in_file):
            raise PlanInputError(f"override +{key}=...: {key} is already a key of {schema.name}; drop the + to set it "
                                 "(Hydra refuses to add a key that is there)")
    return ignored


def parse_override(text: str) -> tuple[str, str, str]:
    """``(kind, key, value)`` of a Hydra override: ``KEY=VALUE``, ``+KEY=VALUE``, ``++KEY=VALUE`` (``~KEY`` deletes:
    kind ``"~"``, value ``""``); :class:`PlanInputError` for anything else."""
    kind = "++" if text.startswith("++") else "+" if text.startswith("+") else "~" if text.startswith("~") else ""
    body = text[len(kind):]
    key, eq, value = body.partition("=")
    if kind == "~":
        if not key:
            raise PlanInputError(f"override {text!r}: expected ~KEY to delete a key")
        return kind, key, ""
    if not eq or not key or any(c in key for c in " =+~"):
        raise PlanInputError(f"override {text!r}: expected KEY=VALUE (or +KEY=VALUE, ++KEY=VALUE, ~KEY), "
                             "e.g. data.train_batch_size=512")
    return kind, key, value


# --------------------------------------------------------------------------- regenerating the data


def _annotation_names(node: ast.AST) -> list[str]:
    """The class names an annotation mentions, outermost first (``Optional[Dict[str, RewardConfig]]`` ->
    ``Optional, Dict, str, RewardConfig``)."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):  # a forward reference
            out.append(n.value)
    return out


def roll_keys(root: Path) -> tuple[list[str], list[str]]:
    """(leaf keys, open keys) of ROLL's :data:`ROLL_CONFIG`, read with :mod:`ast` from a ROLL source tree at ``root``.

    Every annotated field of each dataclass (its bases' first) is a key; a field whose type is another of the
    dataclasses adds that class's keys below it; ``Dict[str, X]`` of a dataclass ``X`` adds ``X``'s keys below
    any name (``*``); a ``dict`` / ``Dict`` / ``Any`` field is open."""
    classes: dict[str, tuple[list[str], list[tuple[str, ast.AST]]]] = {}
    for rel in ROLL_FILES:
        tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                fields = [(s.target.id, s.annotation) for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                          and not s.target.id.startswith("_")]
                classes[node.name] = (bases, fields)

    def fields_of(name: str) -> list[tuple[str, ast.AST]]:
        bases, own = classes[name]
        out: dict[str, ast.AST] = {}
        for b in bases:
            if b in classes:
                out.update(dict(fields_of(b)))
        out.update(dict(own))
        return list(out.items())

    leaves: list[str] = []
    open_: list[str] = []

    def walk(name: str, prefix: str, depth: int) -> None:
        for field_name, ann in fields_of(name):
            key = f"{prefix}.{field_name}" if prefix else field_name
            names = _annotation_names(ann)
            inner = [n for n in names if n in classes]
            if inner and depth < 6:
                if "Dict" in names or "dict" in names:
                    walk(inner[0], f"{key}.*", depth + 1)
                else:
                    walk(inner[0], key, depth + 1)
                continue
            leaves.append(key)
            if {"Dict", "dict", "Any", "DictConfig"} & set(names):
                open_.append(key)

    walk(ROLL_CONFIG, "", 0)
    return sorted(set(leaves)), sorted(set(open_))


def _write_verl(config_dir: Path, version: str) -> list[Path]:
    out = []
    for family, name in VERL_CONFIGS.items():
        src = config_dir / f"_generated_{name}.yaml"
        body = src.read_text(encoding="utf-8")
        header = (f"# verl {version}: verl/trainer/config/_generated_{name}.yaml of the verl {version} wheel, the composed\n"
                  f"# {name}.yaml of verl's {'FSDP' if family == 'fsdp' else 'Megatron'} trainer as verl generates it "
                  "(Apache-2.0, the verl authors).\n"
                  "# timeshare plan checks a verl config's keys against it and starts --config-name "
                  f"{name} from it.\n# Regenerate: python -m sim.planner.config_keys verl VERL_CONFIG_DIR\n")
        dst = DATA / f"verl-{version}-{name}.yaml"
        dst.write_text(header + body, encoding="utf-8")
        out.append(dst)
    return out


def _write_roll(root: Path, source: str, commit: str) -> Path:
    leaves, open_ = roll_keys(root)
    dst = DATA / "roll-rlvr_config.json"
    dst.write_text(json.dumps({"source": source, "commit": commit, "config": ROLL_CONFIG, "files": list(ROLL_FILES),
                               "keys": leaves, "open": open_}, indent=1) + "\n", encoding="utf-8")
    return dst


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.planner.config_keys verl DIR [VERSION]`` / ``roll ROOT SOURCE_WORDS COMMIT``: rewrite the data."""
    import argparse
    import logging

    ap = argparse.ArgumentParser(prog="python -m sim.planner.config_keys", description=main.__doc__)
    sub = ap.add_subparsers(dest="framework", required=True)
    v = sub.add_parser("verl", help="copy verl's generated trainer configs from an installed verl")
    v.add_argument("config_dir", type=Path, help="verl/trainer/config of an installed verl")
    v.add_argument("--version", default=VERL_VERSION)
    r = sub.add_parser("roll", help="read ROLL's RLVRConfig keys from a source tree")
    r.add_argument("root", type=Path, help="a ROLL source tree (with roll/configs/)")
    r.add_argument("--source", required=True, help="where the tree is from, in words (e.g. alibaba/ROLL of DATE)")
    r.add_argument("--commit", default="", help="the tree's commit")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paths = (_write_verl(args.config_dir, args.version) if args.framework == "verl"
             else [_write_roll(args.root, args.source, args.commit)])
    for p in paths:
        logging.getLogger(__name__).info("wrote %s", p)
    return 0


__all__ = ["DATA", "HYDRA_KEYS", "KeySchema", "ROLL_CONFIG", "ROLL_FILES", "VERL_CONFIGS", "VERL_MOVED", "VERL_VERSION",
           "check_config", "flat_keys", "main", "near_miss", "parse_override", "roll_keys", "roll_schema", "roll_source",
           "unknown_key_error", "verl_config_path", "verl_schema"]

if __name__ == "__main__":
    raise SystemExit(main())
