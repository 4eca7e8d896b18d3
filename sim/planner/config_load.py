"""Loading a verl or ROLL config for ``timeshare plan`` as Hydra composes it: a file, a defaults list, overrides.

:func:`load_config` takes what a launch script gives its trainer:

* a config file (``timeshare plan CONFIG.yaml``), or Hydra's ``--config-path DIR --config-name NAME``: NAME.yaml
  in DIR, or, when DIR has none, verl's own trainer config of that name (``ppo_trainer``,
  ``ppo_megatron_trainer``: verl 0.9.1's, shipped, :mod:`sim.planner.config_keys`), as
  ``python -m verl.trainer.main_ppo --config-path=config --config-name=...`` finds it in verl's package;
  with neither, verl's ``ppo_trainer`` (what ``python -m verl.trainer.main_ppo`` runs without a name);
* a defaults list in the file (``defaults: [ppo_trainer, _self_]``): verl's trainer configs by name, other files
  of the config's directory (``NAME`` or ``NAME@_here_`` at the top, ``NAME@a.b`` below ``a.b``), and ``_self_``
  (the file itself; last when not listed, as in Hydra 1.1 and later);
* overrides as Hydra takes them: ``KEY=VALUE`` sets a key the config has, ``+KEY=VALUE`` adds one it has not,
  ``++KEY=VALUE`` adds or sets, ``~KEY`` deletes; values are YAML (``true``, ``1e-6``, ``[a,b]``).

It returns the config (interpolations resolved), the keys the files set and the overrides, for the key check of
:func:`sim.planner.config_keys.check_config` once the framework and strategy are known.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.planner.config_keys import HYDRA_KEYS, VERL_CONFIGS, VERL_VERSION, flat_keys, parse_override, verl_config_path
from sim.planner.plan_inputs import PlanInputError


@dataclass
class LoadedConfig:
    """A config as the plan reads it: the data, where it came from, the keys its files set, its overrides."""

    data: dict[str, Any]
    path: str  # the file (or verl's config name) named in messages
    file_keys: list[str]  # dotted keys set by the user's own files (not by verl's shipped trainer configs)
    overrides: list[tuple[str, str, str]]  # (kind, key, value) as parse_override reads them
    verl_base: str | None = None  # the verl trainer config the file starts from (ppo_trainer, ...), if any
    notes: list[str] = field(default_factory=list)


def _omegaconf():
    try:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        raise PlanInputError("reading a verl or ROLL config needs omegaconf (pip install omegaconf)") from None
    return OmegaConf, OmegaConfBaseException


def _verl_name(name: str) -> str | None:
    """``ppo_trainer`` for ``ppo_trainer``, ``ppo_trainer.yaml`` and the like; None for a name that is not verl's."""
    stem = name.removesuffix(".yaml")
    return stem if stem in VERL_CONFIGS.values() else None


def _load_yaml(path: Path, where: str) -> Any:
    OmegaConf, ConfigError = _omegaconf()
    try:
        return OmegaConf.load(path)
    except (ConfigError, UnicodeDecodeError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanInputError(f"{where}: cannot read the config ({first})") from None
    except Exception as exc:  # noqa: BLE001 - a YAML scanner error and the like: bad input, not a bug
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanInputError(f"{where}: not a YAML config ({first})") from None


def _verl_base(name: str) -> Any:
    family = next(f for f, n in VERL_CONFIGS.items() if n == name)
    return _load_yaml(verl_config_path(family), f"verl {VERL_VERSION}'s {name}.yaml")


def _compose(cfg: Any, directory: Path, where: str, depth: int = 0) -> tuple[Any, list[str], str | None]:
    """(the config with its defaults list merged in, the keys the user's files set, verl's base config's name)."""
    OmegaConf, _ = _omegaconf()
    if not OmegaConf.is_dict(cfg):
        raise PlanInputError(f"{where}: expected a YAML mapping at the top")
    raw_defaults = cfg.get("defaults") if "defaults" in cfg else None
    own = OmegaConf.create({k: v for k, v in cfg.items_ex(resolve=False) if k not in HYDRA_KEYS})
    own_keys = flat_keys(OmegaConf.to_container(own, resolve=False))
    if raw_defaults is None:
        return own, own_keys, None
    entries = OmegaConf.to_container(raw_defaults, resolve=False)
    if not isinstance(entries, list):
        raise PlanInputError(f"{where}: defaults: expected a list (Hydra's defaults list)")
    if "_self_" not in entries:
        entries = [*entries, "_self_"]
    merged, keys, base = OmegaConf.create({}), [], None
    for entry in entries:
        if entry == "_self_":
            merged, keys = OmegaConf.merge(merged, own), keys + own_keys
            continue
        if not isinstance(entry, str) or entry.startswith("override ") or depth > 4:
            raise PlanInputError(f"{where}: defaults entry {entry!r}: the plan composes verl's trainer configs "
                                 f"({', '.join(VERL_CONFIGS.values())}), files beside the config and _self_; give the "
                                 "composed config instead (python -m verl.trainer.main_ppo --cfg job prints it)")
        name, _at, package = entry.partition("@")
        if _verl_name(name) and not (directory / f"{_verl_name(name)}.yaml").is_file():
            base = _verl_name(name)
            merged = OmegaConf.merge(merged, _verl_base(base))
            continue
        path = directory / (name if name.endswith(".yaml") else f"{name}.yaml")
        if not path.is_file():
            raise PlanInputError(f"{where}: defaults entry {entry!r}: no {path.name} beside the config")
        sub, sub_keys, sub_base = _compose(_load_yaml(path, str(path)), path.parent, str(path), depth + 1)
        base = base or sub_base
        if package and package != "_here_":
            sub = _nest(sub, package)
            sub_keys = [f"{package}.{k}" for k in sub_keys]
        merged, keys = OmegaConf.merge(merged, sub), keys + sub_keys
    return merged, keys, base


def _nest(cfg: Any, package: str) -> Any:
    OmegaConf, _ = _omegaconf()
    for part in reversed(package.split(".")):
        cfg = OmegaConf.create({part: cfg})
    return cfg


def _apply_overrides(cfg: Any, overrides: list[tuple[str, str, str]], where: str) -> Any:
    OmegaConf, ConfigError = _omegaconf()
    for kind, key, value in overrides:
        try:
            if kind == "~":
                parent, _dot, last = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                if node is None or last not in node:
                    raise PlanInputError(f"override ~{key}: the config has no {key} to delete")
                node.pop(last)
                continue
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
        except PlanInputError:
            raise
        except (ConfigError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PlanInputError(f"{where}: override {key}={value}: {first}") from None
    return cfg


def load_config(path: str | None, overrides: list[str], *, config_path: str | None = None,
                config_name: str | None = None) -> LoadedConfig:
    """Load a config as described in the module docstring; :class:`PlanInputError` (one line) for anything wrong."""
    OmegaConf, ConfigError = _omegaconf()
    parsed = [parse_override(o) for o in overrides]
    notes: list[str] = []
    if path is not None and config_name is not None:
        raise PlanInputError(f"{path}: give CONFIG.yaml or --config-name, not both")
    if config_name is not None:
        directory = Path(config_path or ".").expanduser()
        file = directory / (config_name if config_name.endswith(".yaml") else f"{config_name}.yaml")
        if file.is_file():
            cfg, keys, base = _compose(_load_yaml(file, str(file)), file.parent, str(file))
            where = str(file)
        elif _verl_name(config_name):
            base = _verl_name(config_name)
            cfg, keys, where = _verl_base(base), [], f"verl {VERL_VERSION}'s {base}.yaml"
            notes.append(f"--config-name {config_name}: verl {VERL_VERSION}'s own {base}.yaml (no {file.name} in "
                         f"{directory})")
        else:
            raise PlanInputError(f"--config-name {config_name}: no {file.name} in --config-path {directory}, and not one "
                                 f"of verl's trainer configs ({', '.join(VERL_CONFIGS.values())})")
    elif path is not None:
        p = Path(path)
        if not p.is_file():
            raise PlanInputError(f"{path}: no such file (give a verl or ROLL YAML config)")
        cfg, keys, base = _compose(_load_yaml(p, path), p.parent, path)
        where = path
    else:  # overrides alone: verl's main_ppo runs ppo_trainer
        base = "ppo_trainer"
        cfg, keys, where = _verl_base(base), [], f"verl {VERL_VERSION}'s ppo_trainer.yaml"
        notes.append(f"no CONFIG: the overrides apply to verl {VERL_VERSION}'s ppo_trainer.yaml, as "
                     "python -m verl.trainer.main_ppo does")
    cfg = _apply_overrides(cfg, parsed, where)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except (ConfigError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanInputError(f"{where}: cannot read the config ({first})") from None
    if not isinstance(data, dict):
        raise PlanInputError(f"{where}: expected a YAML mapping at the top")
    return LoadedConfig(data, where, keys, parsed, base, notes)


__all__ = ["LoadedConfig", "load_config"]
