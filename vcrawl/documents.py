"""Job documents as JSON or YAML text, read within fixed bounds (the job API's bodies, job files, proxy sources).

Whoever submits a job controls its text, so each limit holds before anything walks what was read:

- size: at most ``MAX_DOCUMENT_BYTES`` of text;
- depth: at most ``MAX_DEPTH`` nested lists and mappings (a job is 4 deep; JSON nested 500,000 deep
  would otherwise exhaust the parser's recursion, YAML's composer at ~1,000);
- values: at most ``MAX_VALUES`` of them;
- numbers: integers of at most ``MAX_INT_DIGITS`` digits (Python parses 4,300-digit integers,
  quadratically), finite floats;
- YAML: no anchors, aliases (``&a``/``*a``: a 45-byte alias loop expanded to gigabytes) or merge
  keys (``<<``: a key given twice, silently), no tags beyond the core schema's, no key given twice,
  one document. Dates stay strings, as in JSON.

The YAML reader builds values from the parser's events itself (libyaml's when installed), so no
node graph of an unchecked document is ever made.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from vcrawl.errors import InvalidTask

__all__ = ["MAX_DEPTH", "MAX_DOCUMENT_BYTES", "MAX_INT_DIGITS", "MAX_VALUES", "parse_json", "parse_yaml"]

MAX_DOCUMENT_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_VALUES = 100_000
MAX_INT_DIGITS = 19  # every 64-bit integer
_INT_CHARS = 40  # a YAML integer's text: signs, 0x/0o/0b, underscores and colons around its digits

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's C parser when PyYAML has it


class _JobLoader(_Loader):  # type: ignore[misc, valid-type]
    """The safe loader without YAML 1.1 timestamps: ``2026-01-01`` stays a string, as in JSON."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in _Loader.yaml_implicit_resolvers.items()
    }


_STR, _INT, _FLOAT, _BOOL, _NULL = (f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null"))
_SURROGATE = re.compile("[\ud800-\udfff]")
_MERGE = "tag:yaml.org,2002:merge"  # a plain << (YAML 1.1's merge key type)
_SCALAR_TAGS = frozenset({_STR, _INT, _FLOAT, _BOOL, _NULL})
_COLLECTION_TAGS = frozenset({"tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"})


def parse_json(data: bytes | str, where: str) -> Any:
    """The value of one JSON document within the limits above; a key given twice in an object is refused.

    Raises:
        InvalidTask: ``where`` for text that is not JSON or breaks a limit, saying which.
    """
    _check_size(len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass")), where)
    hooks = _JsonHooks()
    try:
        value = json.loads(data, object_pairs_hook=hooks.mapping, parse_int=hooks.integer, parse_float=hooks.number,
                           parse_constant=hooks.constant)  # fmt: skip
    except _Limit as exc:
        raise InvalidTask(where, str(exc)) from None
    except RecursionError:  # the C scanner's own bound, far past ours
        raise InvalidTask(where, f"nested deeper than {MAX_DEPTH} lists and objects") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidTask(where, f"not valid JSON: {exc}") from None
    _check_tree(value, where)
    return value


def parse_yaml(text: str, where: str) -> Any:
    """The value of one YAML document within the limits above (None for an empty one).

    Raises:
        InvalidTask: ``where`` for text that is not YAML or breaks a limit; the key's path
            (``rules[1].pattern``) for a key given twice.
    """
    _check_size(len(text.encode("utf-8", "surrogatepass")), where)
    loader = _JobLoader(text)
    try:
        return _Builder(loader, where).document()
    except yaml.YAMLError as exc:
        raise InvalidTask(where, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


class _Limit(ValueError):
    """A document breaks one of the limits (raised inside the JSON parser's hooks)."""


def _check_size(size: int, where: str) -> None:
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidTask(where, f"{size} bytes; a job document may hold at most {MAX_DOCUMENT_BYTES}")


class _JsonHooks:
    """The JSON parser's hooks for one document: numbers checked and values counted as they are made
    (a 1 MiB body of ``[{},{},...]`` would otherwise be 350,000 objects before any check), keys given once."""

    def __init__(self) -> None:
        self.values = 0

    def _count(self, values: int) -> None:
        self.values += values
        if self.values > MAX_VALUES:
            raise _Limit(f"more than {MAX_VALUES} values")

    def mapping(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self._count(1 + len(pairs))
        value = dict(pairs)
        if len(value) < len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _Limit(f"the key {key[:60]!r} is given twice in one object: give it once")
                seen.add(key)
        return value

    def integer(self, text: str) -> int:
        self._count(1)
        if len(text.lstrip("-")) > MAX_INT_DIGITS:
            raise _Limit(f"an integer of {len(text.lstrip('-'))} digits; at most {MAX_INT_DIGITS} are accepted")
        return int(text)

    def number(self, text: str) -> float:
        self._count(1)
        value = float(text)
        if not math.isfinite(value):
            raise _Limit("a number out of range (it reads as infinite)")
        return value

    def constant(self, name: str) -> float:
        raise _Limit(f"{name} is not a JSON number")


def _check_tree(root: Any, where: str) -> None:
    """Depth, count and text of an already parsed JSON value, walked without recursion."""
    pending: list[tuple[Any, int]] = [(root, 0)]
    count = 0
    while pending:
        value, depth = pending.pop()
        count += 1
        if count > MAX_VALUES:
            raise InvalidTask(where, f"more than {MAX_VALUES} values")
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise InvalidTask(where, f"nested deeper than {MAX_DEPTH} lists and objects")
            if isinstance(value, dict):
                pending.extend((key, depth + 1) for key in value)
            children = value.values() if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)


def _check_text(text: str, where: str) -> None:
    """JSON's ``\\ud800`` escapes make strings that are not Unicode text: nothing could store or send them."""
    if (match := _SURROGATE.search(text)) is not None:
        raise InvalidTask(where, f"a string holds a lone surrogate (U+{ord(match.group()):04X}): not Unicode text")


@dataclass
class _Frame:
    """A mapping or list being built: where it is, what it holds so far, the key awaiting its value."""

    path: str | None  # None: the document itself
    value: dict[Any, Any] | list[Any]
    key: Any = None
    expects_key: bool = True
    key_lines: dict[Any, int] = field(default_factory=dict)

    def child_path(self) -> str:
        if self.path is None:
            return ""
        if isinstance(self.value, list):
            return f"{self.path}[{len(self.value)}]"
        return f"{self.path}.{self.key}" if self.path else str(self.key)


class _Builder:
    """Values of one YAML document built from the parser's events, each event checked as it comes."""

    def __init__(self, loader: Any, where: str) -> None:
        self.loader, self.where = loader, where
        self.stack: list[_Frame] = []
        self.values = 0

    def document(self) -> Any:
        loader = self.loader
        loader.get_event()  # StreamStart
        if loader.check_event(yaml.StreamEndEvent):
            return None
        loader.get_event()  # DocumentStart
        result = self._node()
        loader.get_event()  # DocumentEnd
        if not loader.check_event(yaml.StreamEndEvent):
            raise InvalidTask(self.where, "holds more than one YAML document (---); give one")
        return result

    def _node(self) -> Any:
        """Read one node and everything in it; return its value."""
        handlers: dict[type, Callable[[Any], None]] = {
            yaml.ScalarEvent: self._scalar,
            yaml.SequenceStartEvent: self._start,
            yaml.MappingStartEvent: self._start,
            yaml.SequenceEndEvent: self._end,
            yaml.MappingEndEvent: self._end,
        }
        root: list[Any] = []
        self.stack.append(_Frame(None, root))  # a list holding the document's one value
        while True:
            event = self.loader.get_event()
            if isinstance(event, yaml.AliasEvent):
                self._refuse(event, f"uses the alias *{event.anchor}: aliases are not accepted; write the value out")
            if getattr(event, "anchor", None) is not None:
                self._refuse(event, f"sets the anchor &{event.anchor}: anchors are not accepted")
            handlers[type(event)](event)
            if len(self.stack) == 1 and root:
                self.stack.pop()
                return root[0]

    def _scalar(self, event: yaml.ScalarEvent) -> None:
        frame = self.stack[-1]
        tag = self._tag(event)
        if isinstance(frame.value, dict) and frame.expects_key:
            if tag == _MERGE:
                self._refuse(event, "is a merge key (<<): merge keys are not accepted; give each key once")
        self._add(event, self._scalar_value(event, tag))

    def _tag(self, event: yaml.ScalarEvent) -> str:
        if event.tag is not None and event.tag != "!":
            if event.tag not in _SCALAR_TAGS:
                self._refuse(event, f"has the tag {event.tag}: only plain strings, numbers, booleans and null")
            return event.tag
        return self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)

    def _scalar_value(self, event: yaml.ScalarEvent, tag: str) -> Any:
        if tag == _INT and len(event.value) > _INT_CHARS:  # 0x..., 1_000, sexagesimal: bound the text first
            self._refuse(event, f"is an integer of {len(event.value)} characters; at most {MAX_INT_DIGITS} digits")
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        constructors = {_STR: lambda: event.value, _INT: lambda: self.loader.construct_yaml_int(node),
                        _FLOAT: lambda: self.loader.construct_yaml_float(node),
                        _BOOL: lambda: self.loader.construct_yaml_bool(node), _NULL: lambda: None}  # fmt: skip
        try:
            value = constructors.get(tag, lambda: event.value)()
        except (ValueError, KeyError, IndexError, OverflowError):  # e.g. "!!float abc": the value is not repeated
            self._refuse(event, f"is not a valid {tag.rsplit(':', 1)[-1]}")
        if isinstance(value, float) and not math.isfinite(value):
            self._refuse(event, "is not a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
            self._refuse(event, f"is an integer of more than {MAX_INT_DIGITS} digits")
        if isinstance(value, str):
            _check_text(value, self.where)
        return value

    def _start(self, event: yaml.CollectionStartEvent) -> None:
        if event.tag is not None and event.tag != "!" and event.tag not in _COLLECTION_TAGS:
            self._refuse(event, f"has the tag {event.tag}: only plain lists and mappings")
        if len(self.stack) > MAX_DEPTH:
            self._refuse(event, f"is nested deeper than {MAX_DEPTH} lists and mappings")
        frame = self.stack[-1]
        if isinstance(frame.value, dict) and frame.expects_key:
            self._refuse(event, "is a list or mapping used as a key: keys are plain strings")
        value: dict[Any, Any] | list[Any] = {} if isinstance(event, yaml.MappingStartEvent) else []
        self._count(event)
        self.stack.append(_Frame(frame.child_path(), value))

    def _end(self, event: yaml.CollectionEndEvent) -> None:
        done = self.stack.pop()
        frame = self.stack[-1]
        self._store(frame, done.value)

    def _add(self, event: yaml.ScalarEvent, value: Any) -> None:
        self._count(event)
        frame = self.stack[-1]
        if isinstance(frame.value, dict) and frame.expects_key:
            line = event.start_mark.line + 1
            frame.key, frame.expects_key = value, False
            if value in frame.key_lines:
                first = frame.key_lines[value]
                raise InvalidTask(frame.child_path(), f"given twice (lines {first} and {line}): give it once")
            frame.key_lines[value] = line
            return
        self._store(frame, value)

    def _store(self, frame: _Frame, value: Any) -> None:
        if isinstance(frame.value, list):
            frame.value.append(value)
        else:
            frame.value[frame.key] = value
            frame.expects_key = True

    def _count(self, event: yaml.Event) -> None:
        self.values += 1
        if self.values > MAX_VALUES:
            self._refuse(event, f"makes more than {MAX_VALUES} values")

    def _refuse(self, event: yaml.Event, problem: str) -> None:
        raise InvalidTask(self.where, f"line {event.start_mark.line + 1}: {problem}")
