"""How one setting is declared: a dataclass field whose metadata says how it looks on the command line.

A command's settings are one dataclass (prefdata.settings.commands). Each field holds the setting's
name (the Python keyword and the TOML key), its type, its default and its help text; the metadata adds
the flag, metavar, parser and `--help` section. The CLI's argparse parser, the TOML keys the config
loader accepts, the `--help` text and the docs' flag tables are all made from these fields, so the
four cannot drift apart (tests/settings/test_settings.py checks the function signatures and docs against them).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar

_KEY = "prefdata"
Fn = TypeVar("Fn", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """How a setting appears on the command line (and in `--help` and the docs)."""

    help: str
    flag: str | None  # None: a Python and TOML setting with no flag
    group: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None  # "on" (store_true), "off" (--no-X, store_false), "on/off", "append", "many"
    const: Any = None  # with action "optional-value": the value of the bare flag
    exclusive: str | None = None  # settings sharing this name are mutually exclusive
    default_text: str | None = None  # the default in words, where it is decided at run time
    required: bool = False  # the CLI needs it (from a flag or the config file); in an exclusive group: one of them


def setting(
    default: Any,
    help: str,
    *,
    group: str,
    flag: str | None | bool = True,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | list[str] | None = None,
    action: str | None = None,
    const: Any = None,
    exclusive: str | None = None,
    default_text: str | None = None,
    required: bool = False,
) -> Any:
    """A dataclass field for one setting. `flag=True` derives `--max-length` from `max_length` (set after
    the field is named, in `flags_of`); `flag=False` declares a setting with no flag. `required`: the command
    line needs it, from its flag or the config file (`--help` says so and shows it unbracketed in the usage);
    a required setting in an `exclusive` group is required unless another of the group is given."""
    spec = Flag(help=help, flag=None if flag is False else ("" if flag is True else flag), group=group,
                metavar=metavar, parse=parse, choices=tuple(choices) if choices else None, action=action,
                const=const, exclusive=exclusive, default_text=default_text, required=required)
    return field(default=default, metadata={_KEY: spec})


@dataclass(frozen=True)
class Declared:
    """One declared setting, its field name resolved."""

    name: str
    default: Any
    type: str
    spec: Flag
    alternatives: tuple[str, ...] = ()  # the flags of its exclusive group that also satisfy a requirement

    @property
    def flag(self) -> str | None:
        if self.spec.flag is None:
            return None
        return self.spec.flag or "--" + self.name.replace("_", "-")

    def default_words(self) -> str | None:
        """The default as `--help` and the docs say it; None when there is nothing to say."""
        if self.spec.default_text is not None:
            return self.spec.default_text
        if self.default is None or self.spec.action in ("on", "off"):
            return None
        return str(self.default)

    @property
    def meaning(self) -> str:
        """The help text, saying when the setting is required."""
        if not self.spec.required:
            return self.spec.help
        unless = f" unless {' or '.join(self.alternatives)}" if self.alternatives else ""
        return f"{self.spec.help} (required{unless})"

    def help_line(self) -> str:
        words = self.default_words()
        return f"{self.meaning} (default {words})" if words else self.meaning


class Settings:
    """Base of every command's settings dataclass: the keyword form, and the names only Python takes."""

    # Keywords the command's function takes that are no setting (objects, torchrun's rank): not TOML keys.
    python_only: ClassVar[frozenset[str]] = frozenset()
    # Settings the CLI consumes itself before calling the function (e.g. refs' --engine ray).
    routed: ClassVar[frozenset[str]] = frozenset()

    def keywords(self) -> dict[str, Any]:
        """The settings as the keyword arguments of the command's function."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.name not in self.routed}


def declared(cls: type) -> list[Declared]:
    """Every setting of a settings dataclass, in declaration order."""
    items = [Declared(f.name, f.default, str(f.type), f.metadata[_KEY]) for f in dataclasses.fields(cls)]
    return [dataclasses.replace(item, alternatives=tuple(
        other.flag or other.name for other in items
        if other is not item and item.spec.required and item.spec.exclusive and other.spec.exclusive == item.spec.exclusive))
        for item in items]


def missing_required(cls: type, settings: dict[str, Any]) -> list[Declared]:
    """The required settings that no source set (a required one of an exclusive group is set when any of
    the group is)."""
    given = {name for name, value in settings.items() if value not in (None, "", [], ())}
    items = declared(cls)
    group_given = {item.spec.exclusive for item in items if item.spec.exclusive and item.name in given}
    return [item for item in items if item.spec.required and item.name not in given
            and not (item.spec.exclusive and item.spec.exclusive in group_given)]


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def with_flags(cls: type, order: tuple[str, ...]) -> list[Declared]:
    """The settings that have a flag, section by section in `order` (declaration order within one)."""
    rank = {group: index for index, group in enumerate(order)}
    items = [item for item in declared(cls) if item.flag is not None]
    return sorted(items, key=lambda item: rank.get(item.spec.group, len(rank)))


def add_to_parser(parser: argparse.ArgumentParser, cls: type, order: tuple[str, ...]) -> dict[str, Any]:
    """The settings' flags, in `--help` sections by group; returns the sections. Every default is None, so
    that a flag left out does not override the config file; the declared default applies when no source
    sets it."""
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for item in with_flags(cls, order):
        spec = item.spec
        group = groups.get(spec.group) or groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        target = group
        if spec.exclusive:
            target = exclusive.get(spec.exclusive) or exclusive.setdefault(
                spec.exclusive, group.add_mutually_exclusive_group())
        action = target.add_argument(item.flag, dest=item.name, default=None, help=item.help_line(),
                                     **_argparse_kind(item))
        if spec.required:
            # argparse must not enforce it (the config file may set it), but the usage shows it as needed
            (target if spec.exclusive else action).shown_required = True
    return groups


class RequiredInUsage(argparse.HelpFormatter):
    """Shows the settings marked `shown_required` unbracketed in the usage line (`--model POLICY`, and
    `(--tokenizer PATH | --processor PATH)` for an exclusive group), while argparse itself leaves them
    optional: a config file may give them; the command checks (`missing_required`) after reading it."""

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        shown = [x for x in [*actions, *groups] if getattr(x, "shown_required", False) and not x.required]
        for x in shown:
            x.required = True
        try:
            return super()._format_usage(usage, actions, groups, prefix)
        finally:
            for x in shown:
                x.required = False


def _argparse_kind(item: Declared) -> dict[str, Any]:
    spec = item.spec
    if spec.action == "on":
        return {"action": "store_true"}
    if spec.action == "off":
        return {"action": "store_false"}
    if spec.action == "on/off":
        return {"action": argparse.BooleanOptionalAction}
    kind: dict[str, Any] = {"metavar": spec.metavar} if spec.metavar and not spec.choices else {}
    if spec.parse:
        kind["type"] = spec.parse
    if spec.choices:
        kind["choices"] = spec.choices
    if spec.action == "append":
        kind["action"] = "append"
    elif spec.action == "many":
        kind["nargs"] = "+"
    elif spec.action == "optional-value":
        kind.update(nargs="?", const=spec.const)
    return kind


def settings_command(cls: type, positional: tuple[str, ...] = ()) -> Callable[[Fn], Fn]:
    """A command whose body takes its settings as one object: `def train(out_dir, settings: TrainSettings,
    *, loaded_policy=None)`. Callers pass `settings=TrainSettings(...)`, flat keywords, or both (keywords
    win); the flat keywords are a thin layer generated from the declaration (each setting is written
    once: its name, type and default live in `cls`), and the signature Python shows is generated too.
    Keywords in `cls.python_only` (objects, not settings) and the body's own keyword-only parameters go to the
    body as keywords. `positional`: settings
    that may also be given by position after the body's own positionals (`compute_refs(out, model)`)."""

    def wrap(body: Fn) -> Fn:
        names = {f.name for f in dataclasses.fields(cls)} - cls.routed  # routed ones the CLI consumes itself
        body_params = list(inspect.signature(body).parameters.values())
        positionals = [p for p in body_params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD][:-1]
        extras = [p for p in body_params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        own = {p.name for p in extras}  # the body's own keywords (objects, routed settings): passed as given

        @functools.wraps(body)
        def call(*args: Any, settings: Any = None, **keywords: Any) -> Any:
            if len(args) > len(positionals):
                if len(args) > len(positionals) + len(positional):
                    raise TypeError(f"{body.__name__}() takes at most {len(positionals) + len(positional)} positional "
                                    f"arguments ({len(args)} given)")
                for name, value in zip(positional, args[len(positionals):]):
                    if name in keywords:
                        raise TypeError(f"{body.__name__}() got multiple values for argument {name!r}")
                    keywords[name] = value
                args = args[:len(positionals)]
            if settings is not None and not isinstance(settings, cls):
                raise TypeError(f"{body.__name__}() takes settings={cls.__name__}(...), got {type(settings).__name__}")
            passed = {k: keywords.pop(k) for k in list(keywords) if k in cls.python_only or k in own}
            unknown = sorted(set(keywords) - names)
            if unknown:
                raise TypeError(f"{body.__name__}() got an unexpected keyword argument {unknown[0]!r}")
            chosen = dataclasses.replace(settings, **keywords) if settings is not None else cls(**keywords)
            return body(*args, chosen, **passed)

        fields = sorted(dataclasses.fields(cls), key=lambda f: f.name not in positional)  # by position first
        generated = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name in positional
                                       else inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                     for f in fields if f.name in names]
        settings_param = inspect.Parameter("settings", inspect.Parameter.KEYWORD_ONLY, default=None,
                                           annotation=f"{cls.__name__} | None")
        call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*positionals, *generated, *extras, settings_param], return_annotation=inspect.signature(body).return_annotation)
        call.settings_class = cls  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap
